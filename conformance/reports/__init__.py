"""The report of a check: its data, as text tables, as JSON and as JUnit XML."""
