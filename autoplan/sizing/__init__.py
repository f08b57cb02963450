"""How many GPUs, for how long, at what cost (``autoplan plan --nodes A:B``): the node counts of a
sweep (:mod:`sizes`), the expected cost of interruptions (:mod:`failures`), the best plan per
size and the choice among sizes (:mod:`sweep`), and its table and picture (:mod:`report`)."""
