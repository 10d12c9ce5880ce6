"""Reports: tables (`table`), Chrome traces for Perfetto / chrome://tracing (`chrome_trace`) and
PNG figures: Gantt per stream, memory over time, alpha sweep, MFU vs sequence length (`figures`)."""
