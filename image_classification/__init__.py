"""Image classification toolkit: ResNet-family training, evaluation, benchmarking and inference.

Its layers, top to bottom; each imports only from the layers below it: the commands (commands, training,
launch, multiproc, demo), train/, deploy/, data/, arguments/, models/, system/, records/, then errors and
seeding.  Each folder's docstring says what it holds and which it may import.
"""

__version__ = "0.1.0"
