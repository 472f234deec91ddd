"""Side-by-side speed measurements of the toolkit against the code a user would write instead."""
