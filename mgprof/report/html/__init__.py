"""report.html: the offline page, its views (the TensorBoard plugin's), charts and escaping."""
