"""Training: a run from its set-up to its last step.

:mod:`.plan` settles everything a run decides before its first step (after the command line, it is the only
reader of the parsed arguments); :mod:`.startup` checks the backend, the dataset and the workspace before
anything is written; :mod:`.engine` owns what a checkpoint restores; :mod:`.loop` runs the epochs.  Beside
them the maths (:mod:`.optim`, :mod:`.losses`, :mod:`.ema`, :mod:`.batch_augment`) and what the loop
records (:mod:`.metrics`, :mod:`.progress`).

May import: deploy/ (an evaluation runs the deployed model), data/, arguments/, models/, system/, records/,
errors, seeding.  Used by the commands (training.py, launch.py, multiproc.py, demo.py).
"""
