"""Learner progress: when checks are recorded (COURSE_PROGRESS, the flag file, 0 always wins), that
several kernels can write at once, that bad lines and a failing disk never break anything, the
done / tried / not yet table, and the command line."""

import json
import os
import subprocess
import sys

import pytest

from course_utils import ROOT, progress
from course_utils.i18n import text_width


@pytest.fixture(autouse=True)
def private_file(tmp_path, monkeypatch):
    """Every test writes to its own file, with recording off unless it turns it on."""
    path = tmp_path / "home" / "progress.jsonl"
    monkeypatch.setenv(progress.ENV_FILE, str(path))
    monkeypatch.delenv(progress.ENV_SWITCH, raising=False)
    monkeypatch.setattr(progress, "_warned", False)
    return path


def lines(path):
    return path.read_text().splitlines()


# --- when is a check recorded ---------------------------------------------------------------------


def test_nothing_is_written_without_the_variable_or_the_flag(private_file):
    assert progress.recording()[0] is False
    assert progress.record("ch01", "Q1", "correct") is False
    assert not private_file.exists() and not private_file.parent.exists()


def test_the_variable_turns_recording_on(private_file, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    assert progress.record("ch01", "Q1", "correct") is True
    (rec,) = [json.loads(line) for line in lines(private_file)]
    assert {k: rec[k] for k in ("chapter", "exercise", "status")} == {"chapter": "ch01", "exercise": "Q1",
                                                                      "status": "correct"}
    assert rec["time"].endswith("Z") and rec["time"][:2] == "20"


def test_the_flag_turns_recording_on_and_zero_always_wins(private_file, monkeypatch):
    assert progress.main(["--enable"]) == 0
    assert progress.flag_file().parent == private_file.parent and progress.flag_file().is_file()
    assert progress.record("ch02", "Q3", "incorrect") is True
    for off in ("0", "false", "off"):
        monkeypatch.setenv("COURSE_PROGRESS", off)
        assert progress.recording() == (False, f"off (COURSE_PROGRESS={off} in the environment)")
        assert progress.record("ch02", "Q3", "correct") is False
    monkeypatch.delenv("COURSE_PROGRESS")
    assert progress.main(["--disable"]) == 0
    assert not progress.flag_file().exists()
    assert progress.record("ch02", "Q3", "correct") is False
    assert len(lines(private_file)) == 1


def test_a_check_records_its_result(private_file, monkeypatch):
    from course_utils.exercises.ch00 import q1

    assert q1.check(q1.reference()).status == "correct"  # off: nothing
    assert not private_file.exists()
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    q1.check(...)
    q1.check([1, 4, 9])
    q1.check(q1.reference())
    got = [json.loads(line) for line in lines(private_file)]
    assert [(r["chapter"], r["exercise"], r["status"]) for r in got] == [
        ("ch00", "Practice", "not_attempted"), ("ch00", "Practice", "incorrect"), ("ch00", "Practice", "correct")]


def test_a_failing_disk_never_breaks_a_check_and_warns_once(tmp_path, monkeypatch, capsys):
    from course_utils.exercises.ch00 import q1

    (tmp_path / "a_file").write_text("")  # a file where the folder should be: no root can write there
    monkeypatch.setenv(progress.ENV_FILE, str(tmp_path / "a_file" / "progress.jsonl"))
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    assert q1.check(q1.reference()).status == "correct"
    assert q1.check([1]).status == "incorrect"
    err = capsys.readouterr().err
    assert err.count("could not be saved") == 1 and "COURSE_PROGRESS=0" in err


# --- the file -------------------------------------------------------------------------------------

WRITER = """
import sys
from course_utils import progress
n, who = int(sys.argv[1]), sys.argv[2]
for i in range(n):
    progress.record(f"ch0{i % 7}", f"{who}-{i}-" + "x" * (i % 300), ("correct", "incorrect")[i % 2])
"""


@pytest.mark.slow
def test_several_processes_append_at_once_and_every_line_is_whole(private_file):
    env = {**os.environ, "COURSE_PROGRESS": "1", "PYTHONPATH": str(ROOT)}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, "400", f"w{k}"], env=env) for k in range(4)]
    for w in writers:
        assert w.wait(timeout=120) == 0
    records, bad = progress.read(private_file)
    assert bad == 0 and len(records) == 1600 == len(lines(private_file))
    names = {r["exercise"] for r in records}
    assert names == {f"w{k}-{i}-" + "x" * (i % 300) for k in range(4) for i in range(400)}


def test_corrupt_lines_are_skipped_and_counted(private_file, capsys):
    good = json.dumps({"time": "2026-01-01T00:00:00Z", "chapter": "ch01", "exercise": "Q1", "status": "correct"})
    private_file.parent.mkdir()
    private_file.write_bytes(
        b"\n".join([good.encode(), b"not json", b'{"chapter": 1, "exercise": "Q1", "status": "correct"}',
                    b'{"chapter": "ch01", "exercise": "Q2", "status": "maybe"}', b"[1, 2]", b"\xff\xfe{",
                    b"[" * 100_000, b"", good.encode(), b'{"chapter": "ch01", "exer'])
    )
    records, bad = progress.read(private_file)
    assert len(records) == 2 and bad == 7
    assert progress.main([]) == 0
    out = capsys.readouterr().out
    assert "7 unreadable lines skipped" in out and "2 checks recorded" in out


def test_a_line_cut_short_stays_alone_and_the_next_is_whole(private_file, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    progress.record("ch01", "Q1", "incorrect")
    with private_file.open("a") as f:
        f.write('{"time": "2026-01-0')  # what a full disk may leave
    progress.record("ch01", "Q1", "correct")
    records, bad = progress.read(private_file)
    assert [r["status"] for r in records] == ["incorrect", "correct"] and bad == 1


def test_a_failed_write_leaves_no_half_line(private_file, monkeypatch):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    progress.record("ch01", "Q1", "incorrect")
    before = private_file.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(progress.os, "write", half_then_full)
    assert progress.record("ch01", "Q2", "correct") is False
    monkeypatch.setattr(progress.os, "write", real_write)
    assert private_file.read_bytes() == before


# --- the table ------------------------------------------------------------------------------------


def rec(chapter, exercise, status):
    return {"time": "2026-01-01T00:00:00Z", "chapter": chapter, "exercise": exercise, "status": status}


def test_done_tried_and_not_yet():
    known = {"ch00": ["Practice"], "ch01": ["Q1", "Q2", "Q3", "Q4", "Q5"]}
    records = [rec("ch01", "Q1", "incorrect"), rec("ch01", "Q1", "correct"),  # correct in the end: done
               rec("ch01", "Q2", "incorrect"), rec("ch01", "Q2", "not_attempted"),  # never correct: tried
               rec("ch01", "Q3", "not_attempted"),  # only the placeholder: not yet
               rec("ch01", "Q5", "correct"), rec("ch01", "Q5", "incorrect"),  # correct once: done
               rec("ch01", "Q9", "incorrect")]  # not (or no longer) in the course: shown after
    s = progress.summarise(records, known)
    assert s.states == {"ch00": {"Practice": "not yet"},
                        "ch01": {"Q1": "done", "Q2": "tried", "Q3": "not yet", "Q4": "not yet", "Q5": "done",
                                 "Q9": "tried"}}
    assert (s.count("done"), s.count("tried"), s.count("not yet"), s.total) == (2, 2, 3, 7)
    table = progress.format_table(s, {"ch00": "00_start_here", "ch01": "01_autograd"}).splitlines()
    assert table[0].split() == ["chapter", "Practice", "Q1", "Q2", "Q3", "Q4", "Q5", "Q9", "done"]
    assert table[1].split() == ["00_start_here", "not", "yet", "0/1"]
    assert table[2].split() == ["01_autograd", "done", "tried", "not", "yet", "not", "yet", "done", "tried",
                                "2/6"]


def test_every_chapter_and_exercise_is_listed():
    from course_utils.exercises import ch00, ch04

    found = progress.chapters()
    assert sorted(found) == [f"ch0{i}" for i in range(8)]
    assert found["ch00"] == [ex.name for ex in ch00.EXERCISES]
    assert found["ch04"] == [ex.name for ex in ch04.EXERCISES]
    titles = progress.chapter_titles()
    assert titles["ch00"] == "00_start_here" and titles["ch07"] == "07_parallelism"
    assert set(titles) == set(found)


def test_exercises_are_read_from_the_words_files_when_a_module_does_not_import(monkeypatch):
    expected = progress.chapters()
    real = progress.importlib.import_module

    def broken(name):
        if name.startswith("course_utils.exercises.ch"):
            raise ImportError("no torch here")
        return real(name)

    monkeypatch.setattr(progress.importlib, "import_module", broken)
    assert progress.chapters() == expected


def test_a_program_without_torch_reads_the_words_files_only():
    """The instructor's view runs without torch: chapters(import_modules=False) imports no exercise
    module (checked in a fresh interpreter) and names the same exercises."""
    code = ("import json, sys; from course_utils import progress; found = progress.chapters(import_modules=False); "
            "assert not [m for m in sys.modules if m.startswith(('torch', 'course_utils.exercises.ch'))], "
            "sorted(sys.modules); print(json.dumps(found))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == progress.chapters()


def test_parse_reads_the_bytes_of_a_progress_file():
    good = {"time": "2026-12-06T09:00:00Z", "chapter": "ch01", "exercise": "Q1", "status": "correct"}
    raw = (json.dumps(good) + "\n" + "not json\n\n" + json.dumps({**good, "status": "maybe"}) + "\n").encode()
    assert progress.parse(raw) == ([good], 2)


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.slow
def test_command_shows_every_exercise_not_yet_and_where_the_file_is(private_file):
    proc = subprocess.run([sys.executable, "-m", "course_utils", "progress"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    total = sum(len(names) for names in progress.chapters().values())
    assert f"total: 0 done, 0 tried, {total} not yet, of {total} exercises" in proc.stdout
    assert f"0 checks recorded in {progress._show_path(private_file)}; this computer only." in proc.stdout
    assert "Recording is off" in proc.stdout and not private_file.exists()


def test_command_counts_what_was_recorded(private_file, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    for status in ("incorrect", "correct"):
        progress.record("ch03", "Q2", status)
    progress.record("ch03", "Q4", "incorrect")
    assert progress.main([]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("03_data_loading"))
    # Practice (chapter 00's) is blank; Q1-Q6; the count
    assert row.split() == ["03_data_loading", "not", "yet", "done", "not", "yet", "tried", "not", "yet", "not", "yet",
                           "1/6"]
    assert "total: 1 done, 1 tried," in out and "Recording is on (COURSE_PROGRESS=1" in out


def test_reset_needs_yes(private_file, monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS", "1")
    progress.record("ch01", "Q1", "correct")
    progress.record("ch01", "Q2", "correct")
    assert progress.main(["--reset"]) == 1
    assert "--reset --yes" in capsys.readouterr().out and len(lines(private_file)) == 2
    assert progress.main(["--reset", "--yes"]) == 0
    assert "2 lines removed" in capsys.readouterr().out
    assert progress.read(private_file) == ([], 0)
    with pytest.raises(SystemExit):
        progress.main(["--yes"])
    with pytest.raises(SystemExit):
        progress.main(["--enable", "--disable"])


def test_enable_says_when_the_variable_overrides_it(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_PROGRESS", "0")
    assert progress.main(["--enable"]) == 0
    assert "Recording is now off (COURSE_PROGRESS=0 in the environment)" in capsys.readouterr().out


def test_the_engine_imports_it_without_torch():
    code = "import sys, course_utils.progress; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


# --- the Chinese edition ----------------------------------------------------------------------------


def test_the_table_and_messages_in_chinese_stay_aligned(private_file, monkeypatch, capsys):
    known = {"ch00": ["Practice"], "ch01": ["Q1", "Q2", "Q3"]}
    records = [rec("ch01", "Q1", "correct"), rec("ch01", "Q2", "incorrect")]
    titles = {"ch00": "00_start_here", "ch01": "01_autograd"}
    monkeypatch.setenv("COURSE_LANG", "en")
    english = progress.format_table(progress.summarise(records, known), titles).splitlines()
    assert english[0].split() == ["chapter", "Practice", "Q1", "Q2", "Q3", "done"]
    monkeypatch.setenv("COURSE_LANG", "zh")
    table = progress.format_table(progress.summarise(records, known), titles).splitlines()
    assert table[0].split() == ["章节", "Practice", "Q1", "Q2", "Q3", "已完成"]
    assert table[2].split() == ["01_autograd", "已完成", "已尝试", "尚未作答", "1/3"]
    # every row's last column starts at the same terminal column (a Chinese character is two wide)
    assert len({text_width(line) - text_width(line.split()[-1]) for line in table}) == 1
    assert progress.recording() == (False, "已关闭（用 `python -m course_utils progress --enable` 打开）")
    assert progress.main([]) == 0
    out = capsys.readouterr().out
    total = sum(len(names) for names in progress.chapters().values())
    assert f"合计：共 {total} 道练习，已完成 0 道，已尝试 0 道，尚未作答 {total} 道" in out
    assert "只保存在这台电脑上" in out and "进度记录已关闭" in out


@pytest.mark.parametrize("where", [".", "/", "folder"])
def test_a_progress_file_that_is_a_folder_is_refused_with_a_message(where, tmp_path, monkeypatch, capsys):
    """COURSE_PROGRESS_FILE=. or / (no file name) or an existing folder: a clear message, no traceback,
    and recording (which reads the flag beside it) never raises either."""
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(tmp_path) if where == "folder" else where)
    monkeypatch.delenv("COURSE_PROGRESS", raising=False)
    for argv in (["--enable"], ["--disable"], []):
        assert progress.main(argv) == 2
        err = capsys.readouterr().err
        assert "names a folder, not a file" in err and "COURSE_PROGRESS_FILE" in err, err
    assert progress.recording()[0] is False
    assert progress.record("ch01", "Q1", "correct") is False
