"""The EAGLE-3 draft head: its model code and its checkpoint directory."""
