"""One module per `harbor` command group; each exposes `register(app)`."""
