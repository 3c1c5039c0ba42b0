"""mgprof inside the training frameworks: callbacks that open a session, mark steps and regions.

``mgprof.integrations.hf`` holds ``MgprofCallback`` for the Hugging Face ``Trainer``,
``mgprof.integrations.lightning`` one for Lightning, and ``mgprof.integrations.accelerate`` a
``profile(accelerator)`` session for a loop of the script's own (accelerate has no callbacks).
Each framework is imported only by its own module (accelerate by none), so ``import mgprof`` (and
this package) never imports transformers, lightning or accelerate.
See docs/frameworks.md.
"""
