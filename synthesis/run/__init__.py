"""Running the pipeline: its configuration, the context every stage shares, the output folder, progress and the report."""
