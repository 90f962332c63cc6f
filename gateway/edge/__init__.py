"""The edge: the ASGI app, its middleware and the routes clients and operators call."""
