"""Side-by-side speed measurements of the toolkit against the code a user would write instead, the data
loaders, the JPEG decoders and the stages of a loader worker, time to accuracy with progressive resizing, the
JPEG set they can run on where no photographs can be had, and the GPU report's Markdown."""
