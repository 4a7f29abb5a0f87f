"""Side-by-side sweep jobs share an Aim repository that exists before they start."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from tandem.sweeps import InitAimRepo, aim_repos

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def test_the_study_creates_its_aim_repository_before_its_jobs(tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("reproduce", overrides=[f"logger.0.repo={tmp_path / 'aim'}"])
    assert [Path(r) for r in aim_repos(cfg)] == [tmp_path / "aim"]
    InitAimRepo().on_multirun_start(cfg)
    assert (tmp_path / "aim" / ".aim").is_dir()
    InitAimRepo().on_multirun_start(cfg)  # a resumed sweep: the repository is kept


def test_csv_only_sweeps_need_no_repository() -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        assert aim_repos(compose("reproduce", overrides=["logger=csv"])) == []
