"""The cost layer: byte and FLOP formulas, collective times, the roofline."""
