"""MLflow conventions shared by training, sweeps and evals.

Store: `MLFLOW_TRACKING_URI` if set, else a SQLite file inside the project (no server needed).
One MLflow run per training job; params are the flattened config with secrets removed; metric names
are stable (`train/...`, `actor/...`, `timing/...`, `eval/<suite>/<metric>`); checkpoint paths are tags.

Every process opens the store through `mlflow_client()`: the first open of a SQLite store creates or
upgrades its schema under a file lock beside the database (six processes starting on a new store all
failed with `table _alembic_tmp_metrics already exists` without it), and every call retries
"database is locked" with backoff, so independent runs, evals, the watcher and readers can share it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import shutil
import time
from pathlib import Path

from infra.models import PROJECT_ROOT
from infra.redact import redact, redact_text

RUN_DIR_TAG = "rlpost.run_dir"
CHECKPOINT_TAG = "rlpost.checkpoint."
LATEST_CHECKPOINT_TAG = "rlpost.checkpoint_latest"
RUN_ID_FILE = "mlflow_run_id"  # in a run folder: the MLflow run it made (written once the run exists)
SAMPLES_ARTIFACT_DIR = "samples"  # a run's logged samples (train/samples.py writes, analysis/view reads)


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def sqlite_path(uri: str | None = None) -> Path | None:
    """The database file of a `sqlite:///...` tracking URI (None for any other store)."""
    uri = uri or tracking_uri()
    if not uri.startswith("sqlite:///"):
        return None  # another store, or sqlite:// in memory
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def store_exists(uri: str | None = None) -> bool:
    """False only for a SQLite store whose file does not exist yet (readers must not create one)."""
    path = sqlite_path(uri)
    return path is None or path.is_file()


LOCK_RETRIES = 12  # "database is locked": retries after the first attempt, backoff 0.05 s doubling to 5 s
_opened: set[str] = set()  # stores whose schema this process has checked


def _is_locked(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "database table is locked" in text


def with_retry(call, *args, **kwargs):
    """`call(*args, **kwargs)`, retried with exponential backoff and jitter while SQLite says the
    database is locked (another process holds the write lock); other errors pass through at once."""
    for attempt in range(LOCK_RETRIES + 1):
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only lock contention is retried
            if not _is_locked(exc) or attempt == LOCK_RETRIES:
                raise
        time.sleep(min(5.0, 0.05 * 2**attempt) * (0.5 + 0.5 * random.random()))
    raise AssertionError("unreachable")


class _QuietLockErrors(logging.Filter):
    """MLflow logs a full traceback for every "database is locked" before raising it; with_retry
    retries those, so only a final failure (raised to the caller) is shown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_locked(record.getMessage())


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def open_store(uri: str | None = None) -> None:
    """Make sure the store's schema exists and is current, once per process; for SQLite under an
    exclusive lock on `<db>.lock`, so concurrent first users create or upgrade it exactly once."""
    uri = uri or tracking_uri()
    if uri in _opened:
        return
    logging.getLogger("mlflow.store.db.utils").addFilter(_QuietLockErrors())
    path = sqlite_path(uri)
    if path is None:  # a tracking server or another database: its own business
        _opened.add(uri)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _file_lock(path.with_name(path.name + ".lock"))
        lock.__enter__()
    except OSError:
        if not path.is_file():
            raise
        lock = None  # a store in a read-only folder: nobody can create or upgrade it there anyway
    try:
        with_retry(_check_schema, uri, path)
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)
    _opened.add(uri)


def _check_schema(uri: str, path: Path) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # builds the store
    except MlflowException as exc:
        if "out-of-date database schema" not in str(exc):
            raise
        from mlflow.store.db.utils import _upgrade_db, create_sqlalchemy_engine_with_retry

        backup = path.with_name(f"{path.name}.bak-{int(time.time())}")
        shutil.copy2(path, backup)  # MLflow's advice before a migration
        logging.getLogger(__name__).warning("upgrading the MLflow schema of %s (backup %s)", path, backup)
        _upgrade_db(create_sqlalchemy_engine_with_retry(uri))
        mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


class StoreClient:
    """An `mlflow.MlflowClient` whose every call goes through `with_retry`."""

    def __init__(self, uri: str | None = None) -> None:
        import mlflow

        self.tracking_uri = uri or tracking_uri()
        open_store(self.tracking_uri)
        self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr
        return functools.wraps(attr)(functools.partial(with_retry, attr))


def mlflow_client(uri: str | None = None) -> StoreClient:
    """The one way this project opens the MLflow store (schema under a lock, lock contention retried)."""
    return StoreClient(uri)


def experiment_id(client, name: str) -> str:
    """The experiment's id, creating it; another process creating it at the same moment is fine."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def tag_filter(key: str, value: str) -> str | None:
    """An MLflow filter `tags.key = value` with the value quoted so it parses (a value holding a quote
    pasted in unescaped gave a 32-line MLflow traceback); None when it holds both quote kinds."""
    if "'" not in value:
        return f"tags.`{key}` = '{value}'"
    if '"' not in value:
        return f'tags.`{key}` = "{value}"'
    return None


def recorded_run_id(run_dir: str | Path) -> str | None:
    """The MLflow run a run folder already made (a job killed before its first checkpoint resumes in it)."""
    path = Path(run_dir) / RUN_ID_FILE
    return (path.read_text().strip() or None) if path.is_file() else None


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    """A thin MLflow client wrapper for one run; every call is a no-op off rank 0."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.run_id: str | None = None
        self._client = None
        self._logged_steps: set[int] = set()

    @property
    def client(self):
        if self._client is None:
            self._client = mlflow_client()
        return self._client

    def start(
        self,
        experiment: str,
        run_name: str,
        run_id: str | None = None,
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
        progress_metric: str = "train/reward_mean",
    ) -> str | None:
        """`progress_metric`: a metric logged every step, whose history says which steps a resumed run
        already logged (the SFT and DPO stages log `sft/loss`, `dpo/loss`)."""
        if not self.enabled:
            return None
        client = self.client
        if run_id is None:
            exp_id = experiment_id(client, experiment)
            all_tags = dict(tags or {})
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
            run_id = run.info.run_id
        else:
            client.update_run(run_id, status="RUNNING")
            # Steps logged before a crash past the last checkpoint are recomputed on resume; they are
            # not logged twice (see `log_metrics`).
            history = client.get_metric_history(run_id, progress_metric)
            self._logged_steps = {m.step for m in history}
            for k, v in (tags or {}).items():
                client.set_tag(run_id, k, v)
        self.run_id = run_id
        return run_id

    def log_params(self, params: dict[str, object]) -> None:
        if not self.enabled or self.run_id is None:
            return
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        items = [Param(k, str(v)[:6000]) for k, v in redact(params).items() if k not in existing]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled or self.run_id is None or step in self._logged_steps:
            return
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 200):
            self.client.log_batch(self.run_id, metrics=items[i : i + 200])

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.enabled or self.run_id is None:
            return
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def record_checkpoint(self, step: int, path: Path) -> None:
        self.set_tags({f"{CHECKPOINT_TAG}{step}": str(path), LATEST_CHECKPOINT_TAG: str(path)})

    def finish(self, status: str = "FINISHED", error: str | None = None) -> None:
        if not self.enabled or self.run_id is None:
            return
        if error:
            self.client.set_tag(self.run_id, "rlpost.error", redact_text(error)[-5000:])
        self.client.set_terminated(self.run_id, status=status)
