"""report.html: the offline page, its views (the TensorBoard plugin's), charts, escaping, the
palette every chart shares, and the study pages (compare, sweep)."""
