"""The vocabulary's fixed special ids, which the model, the data and the searches rely on.

A module of its own so that processes that only make batches (token-cache and Grain workers) need
not import JAX to know them.
"""

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
