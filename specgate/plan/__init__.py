"""`specgate plan`: size a fleet of speculative, standard and dynamic replicas on paper."""
