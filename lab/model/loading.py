"""The model loaded in a thread of its own, so a page draws first and shows how far it got.

One load per process (the page keeps it with `ui.memo.shared`): a rerun, or another user,
finds the same load, under way or done, and never starts a second one.
"""

from __future__ import annotations

import threading

from lab.model.gguf import LoadedModel, load_smollm2


class ModelLoad:
    def __init__(self) -> None:
        self.fraction = 0.0  # of the load done (lab.model.gguf.load_smollm2's stages)
        self.stage = "Starting"
        self._loaded: LoadedModel | None = None
        self._error: Exception | None = None
        self._done = threading.Event()
        threading.Thread(target=self._load, name="load-smollm2", daemon=True).start()

    def _load(self) -> None:
        try:
            self._loaded = load_smollm2(progress=self._progress)
        except Exception as error:  # kept for the page: the thread has no one to tell
            self._error = error
        finally:
            self._done.set()

    def _progress(self, fraction: float, stage: str) -> None:
        self.fraction, self.stage = fraction, stage

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the load to end: whether it has."""
        return self._done.wait(timeout_s)

    def result(self) -> LoadedModel:
        """The loaded model, once done; the load's error (ModelFileMissing…) raised again."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._loaded is not None
        return self._loaded


def start_model_load() -> ModelLoad:
    return ModelLoad()
