"""The special words of every word-id tensor, and their ids: the vocabulary (``text.vocabulary``)
writes them, the networks (``networks``) read padding as ``PAD_ID``. One place, below both layers.
"""

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)  # ids 0..3, the VSE++ convention
PAD_ID = SPECIALS.index(PAD)       # 0: what padding holds in every word-id tensor
