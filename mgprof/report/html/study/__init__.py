"""report.html of a study: ``mgprof compare``'s strategies and ``mgprof sweep``'s batch sizes.

The same offline page as a run's (plotly.js inlined, a no-network policy, the run report's style
sheet and palette), one page without views: the header, tables made from the cells the terminal
and Markdown forms print (``compare_view``, ``sweep_view``), charts drawn from the record's own
figures, the verdict, the notes and links to each run's report.html.
"""
