"""One module per CLI subcommand: ``register(subparsers)`` adds the parser, ``run(args)`` acts."""


def error_line(command: str, exc: BaseException) -> str:
    """``mgprof COMMAND: error: ...`` as one line of text: a path or a name in the message
    cannot move the cursor, plant a link or break the line (``report.safe_text``)."""
    from mgprof.report.safe_text import printable

    return f"mgprof {command}: error: {printable(str(exc))}"
