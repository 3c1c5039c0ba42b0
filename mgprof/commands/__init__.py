"""One module per CLI subcommand: ``register(subparsers)`` adds the parser, ``run(args)`` acts."""
