"""Model implementations behind ``deqjax.models`` (one idea per file)."""
