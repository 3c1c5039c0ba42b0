"""mgprof inside the training frameworks: callbacks that open a session, mark steps and regions.

``mgprof.integrations.hf`` holds ``MgprofCallback`` for the Hugging Face ``Trainer`` and
``mgprof.integrations.lightning`` one for Lightning. Each framework is imported only by its own
module, so ``import mgprof`` (and this package) never imports transformers or lightning.
See docs/frameworks.md.
"""
