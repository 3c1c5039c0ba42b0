"""A run's report: the sections every format shares, and the terminal, Markdown, JSON renderers."""
