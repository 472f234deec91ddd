"""Side-by-side speed measurements of the toolkit against the code a user would write instead, the JPEG set
they can run on where no photographs can be had, and the GPU report's Markdown."""
