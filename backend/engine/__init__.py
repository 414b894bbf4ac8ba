"""The engine: its loop, the scheduler and paged block pool, sequences, sampling parameters, output processing."""
