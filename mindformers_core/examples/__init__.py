"""Small runnable examples (used by ``make demo``)."""
