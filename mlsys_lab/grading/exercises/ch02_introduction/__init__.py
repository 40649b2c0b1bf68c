"""Chapter 2, the introduction (``solutions/ch02_introduction.ipynb``).

The end-to-end job of a framework, one piece per exercise: 2.1 one training epoch over
mini-batches, 2.2 evaluation (accuracy in eval mode, without the tape), 2.3 a checkpoint that
restores the model *and* the optimiser so training resumes exactly — from the file alone, in a
fresh process. Every model and data set here is small, synthetic and seeded.

The library has no training loop, accuracy or checkpoint helper that would do these exercises
(``ml.save``/``ml.load`` and the ``state_dict`` methods are the tools they teach), so nothing is
forbidden by name; the references in the exercise modules (``_ref_epoch``, ``_ref_accuracy``)
are off limits to the student's code automatically.
"""

from mlsys_lab.grading.exercises.ch02_introduction import (  # noqa: F401
    ex2_1_train_epoch,
    ex2_2_evaluate,
    ex2_3_checkpoint,
)
