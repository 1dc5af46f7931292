import subprocess
import sys

from course_utils import ROOT, doctor


def test_doctor_passes_on_this_machine():
    proc = subprocess.run([sys.executable, "-m", "course_utils", "doctor"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for name in ("python", "torch", "torchvision", "packages", "cpu", "accelerator", "widgets", "graphviz", "data"):
        assert any(line.split()[1:2] == [name] for line in lines if line[:4].strip() in ("OK", "WARN", "FAIL")), name
    assert "0 FAIL" in proc.stdout


def test_pins_are_read_from_requirements():
    pins = doctor.read_pins()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"


def test_other_torch_version_is_a_warning_naming_the_tested_one():
    c = doctor.check_package("torch", "2.14.1", version_of=lambda n: "2.15.0")
    assert c.status == "WARN" and "tested with 2.14.1" in c.detail


def test_missing_torch_is_a_failure_with_a_fix():
    c = doctor.check_package("torch", "2.14.1", version_of=lambda n: None)
    assert c.status == "FAIL" and "make setup" in c.detail


def test_other_packages_missing_or_different():
    pins = {"torch": "1", "torchvision": "1", "nbval": "0.11.0", "pytest": "9.2.0"}
    missing = doctor.check_other_packages(pins, version_of=lambda n: None if n == "nbval" else "9.2.0")
    assert missing.status == "FAIL" and "nbval" in missing.detail
    diff = doctor.check_other_packages(pins, version_of=lambda n: "0.10.0" if n == "nbval" else "9.2.0")
    assert diff.status == "WARN" and "nbval 0.10.0 (tested: 0.11.0)" in diff.detail


def test_old_python_fails():
    assert doctor.check_python((3, 9)).status == "FAIL"
    assert doctor.check_python((3, 11)).status == "OK"


def test_missing_dot_is_only_a_warning():
    assert doctor.check_graphviz(which=lambda name: None).status == "WARN"
    assert doctor.check_graphviz(which=lambda name: "/usr/bin/dot").status == "OK"


def test_widgets_front_end():
    assert doctor.check_widgets(version_of=lambda n: None).status == "FAIL"
    only_kernel_side = doctor.check_widgets(version_of=lambda n: "8.1.9" if n == "ipywidgets" else None)
    assert only_kernel_side.status == "WARN"


def test_altered_data_fails_with_the_command_to_fix_it(tmp_path):
    import shutil

    from course_utils import data

    root = tmp_path / "digits"
    shutil.copytree(data.DIGITS, root)
    next(root.glob("test/0/*.png")).write_bytes(b"not a png")
    c = doctor.check_data(root)
    assert c.status == "FAIL" and "python -m course_utils.data build" in c.detail
    assert c.detail.startswith("unreadable: test/0/")


def test_exit_status_is_non_zero_on_failure(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda: [doctor.Check("torch", "FAIL", "not installed")])
    assert doctor.main([]) == 1
    assert "FAIL  torch" in capsys.readouterr().out
