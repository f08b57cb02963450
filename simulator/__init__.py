"""Workload, memory, analytic and discrete-event models of one training iteration."""
