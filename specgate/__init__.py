"""specgate: the command line and operations tools on top of the gateway and
the bundled backends."""

__version__ = "0.1.0"
