"""Lightning callbacks: atomic iteration-based checkpoints, sample grids, throughput."""
