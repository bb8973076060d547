"""The parts of bench/cuda/peers.py (the driver): common, cli, loaders, steps, inputs, report."""
