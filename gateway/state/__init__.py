"""What gateways share through Redis (or Valkey): the store and its users."""
