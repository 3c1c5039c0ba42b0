"""One module per CLI subcommand: ``register(subparsers)`` adds the parser, ``run(args)`` acts."""


def error_line(command: str, exc: BaseException) -> str:
    """``mgprof COMMAND: error: ...`` as one line of text: a path or a name in the message
    cannot move the cursor, plant a link or break the line (``report.safe_text``)."""
    from mgprof.report.safe_text import printable

    return f"mgprof {command}: error: {printable(str(exc))}"


def help_formatter() -> type:
    """argparse's formatter for a command whose help ends with examples: prose paragraphs are
    wrapped to the terminal as usual, a paragraph whose lines are indented (or that starts
    with a heading such as ``examples:``) keeps its lines as written."""
    import argparse
    import textwrap

    class ExamplesFormatter(argparse.HelpFormatter):
        def _fill_text(self, text: str, width: int, indent: str) -> str:
            out = []
            for block in text.split("\n\n"):
                lines = block.splitlines()
                raw = bool(lines) and (
                    lines[0].rstrip().endswith(":") or any(ln.startswith(" ") for ln in lines)
                )
                if raw:
                    out.append("\n".join(indent + ln for ln in lines))
                else:
                    flat = " ".join(ln.strip() for ln in lines)
                    out.append(
                        textwrap.fill(flat, width, initial_indent=indent, subsequent_indent=indent)
                    )
            return "\n\n".join(out)

    return ExamplesFormatter
