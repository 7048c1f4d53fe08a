"""Writing the report folder: the page's order and files (write), each section's blocks (_*_section),
their Markdown and HTML (render), the figures (_figures, _plots), junit.xml and the step summary (junit);
and what changed between two reports (diff: ``nox -s diff``)."""
