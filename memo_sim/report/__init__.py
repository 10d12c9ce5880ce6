"""Reports: tables, Chrome traces and figures."""
