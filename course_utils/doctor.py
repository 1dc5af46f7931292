"""Environment check for learners and workshop instructors.

    python -m course_utils doctor              # the environment, line by line
    python -m course_utils doctor --workshop   # then the smallest real work of each chapter

One line per check, OK / WARN / FAIL, and an exit status of 1 when anything FAILs.
Every WARN and FAIL says what to run to fix it. ``--workshop`` ends with one line to paste into the
workshop chat: ``READY``, or ``NOT READY: <what to do>``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import platform
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import ROOT
from .i18n import tr

REQUIREMENTS = ROOT / "requirements.txt"


def fix_install() -> str:
    """What to do when a package is missing (in the course's language, as every text below)."""
    return tr("run `make setup` (or `python tasks.py setup`) in the course folder",
              "在课程文件夹中运行 `make setup`（或 `python tasks.py setup`）")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL
    detail: str
    fix: str = ""  # what to do, where the detail does not end with it


def read_pins(path: Path = REQUIREMENTS) -> dict[str, str]:
    """``{normalised-name: version}`` for every ``name==version`` line of a requirements file."""
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
        if m:
            pins[normalise(m.group(1))] = m.group(2)
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def check_python(version: tuple[int, int] = sys.version_info[:2]) -> Check:
    text = f"{version[0]}.{version[1]}"
    if version >= (3, 11):
        return Check("python", "OK", f"Python {text}")
    return Check("python", "FAIL",
                 tr("Python {text}; the course needs 3.11+: install it, then {fix}",
                    "Python {text}；本课程需要 3.11 或更高版本：请先安装，然后{fix}", text=text, fix=fix_install()))


def check_package(name: str, pinned: str | None, version_of: Callable[[str], str | None] = _installed) -> Check:
    got = version_of(name)
    if got is None:
        return Check(name, "FAIL", tr("not installed: {fix}", "未安装：{fix}",
                                      fix=fix_install()))
    if pinned and got.split("+")[0] != pinned.split("+")[0]:
        return Check(name, "WARN",
                     tr("{got} installed; the course is tested with {pinned} (outputs may differ)",
                        "已安装 {got}；本课程用 {pinned} 测试（输出可能有所不同）", got=got, pinned=pinned))
    return Check(name, "OK", got)


def check_other_packages(pins: dict[str, str], version_of: Callable[[str], str | None] = _installed) -> Check:
    missing, different = [], []
    for name, want in sorted(pins.items()):
        if name in ("torch", "torchvision"):
            continue
        got = version_of(name)
        if got is None:
            missing.append(name)
        elif got != want:
            different.append(tr("{name} {got} (tested: {want})", "{name} {got}（测试版本：{want}）",
                                name=name, got=got, want=want))
    if missing:
        return Check("packages", "FAIL", tr("missing: {missing}: {fix}", "缺少：{missing}：{fix}",
                                            missing=', '.join(missing), fix=fix_install()))
    if different:
        return Check("packages", "WARN", tr("other versions: ", "版本不同：") + ", ".join(different))
    return Check("packages", "OK", tr("{value} pinned packages at their tested versions",
                                      "{value} 个固定版本的包都是测试时的版本", value=len(pins) - 2))


def check_cpu() -> Check:
    try:
        from .device import cpu_cores  # the one core count of the course

        n = cpu_cores()
    except ImportError:  # torch does not import: the accelerator line says what to do
        n = os.cpu_count() or 1
    status = "OK" if n >= 2 else "WARN"
    extra = "" if n >= 2 else tr(" (the distributed chapters start 2 processes: expect them to be slow)",
                                 "（分布式章节会启动 2 个进程：预计会比较慢）")
    return Check("cpu", status, tr("{n} cores, {machine}{extra}", "{n} 个核心，{machine}{extra}",
                                   n=n, machine=platform.machine(), extra=extra))


def check_accelerator() -> Check:
    try:
        import torch
    except Exception:
        return Check("accelerator", "FAIL", tr("torch does not import: {fix}", "无法导入 torch：{fix}",
                                               fix=fix_install()))
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return Check("accelerator", "OK", f"CUDA: {names}")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return Check("accelerator", "OK", "Apple MPS")
    return Check("accelerator", "OK", tr("none: the course runs on the CPU (a GPU is optional)",
                                         "无：课程在 CPU 上运行（GPU 不是必需的）"))


def check_widgets(version_of: Callable[[str], str | None] = _installed) -> Check:
    if version_of("ipywidgets") is None:
        return Check("widgets", "FAIL", tr("ipywidgets is not installed: {fix}",
                                           "未安装 ipywidgets：{fix}", fix=fix_install()))
    if version_of("jupyterlab-widgets") is None and version_of("jupyterlab_widgets") is None:
        return Check("widgets", "WARN", tr("the JupyterLab front end for widgets is missing: "
                                           "`pip install jupyterlab_widgets`; sliders will show as text",
                                           "缺少交互控件（widget）的 JupyterLab 前端：请运行 "
                                           "`pip install jupyterlab_widgets`；否则滑块只会显示为文本"))
    return Check("widgets", "OK", tr("ipywidgets and its JupyterLab front end", "ipywidgets 及其 JupyterLab 前端"))


def check_graphviz(which: Callable[[str], str | None] = shutil.which) -> Check:
    if which("dot"):
        return Check("graphviz", "OK", tr("`dot` found: graphs are drawn by graphviz",
                                          "找到了 `dot`：计算图由 graphviz 绘制"))
    return Check("graphviz", "WARN", tr(
        "`dot` not found (optional): graphs use the built-in matplotlib layout; "
        "for graphviz: apt-get install graphviz / brew install graphviz / conda install graphviz",
        "未找到 `dot`（可选）：计算图改用内置的 matplotlib 布局绘制；"
        "如需 graphviz：apt-get install graphviz / brew install graphviz / conda install graphviz"))


def check_data(root: Path | None = None) -> Check:
    from . import data

    root = root or data.DIGITS
    problems = data.verify(root)
    if problems:
        first = problems[0]
        more = tr(" (+{value} more)", "（另有 {value} 处问题）", value=len(problems) - 1) if len(problems) > 1 else ""
        return Check("data", "FAIL", tr("{first}{more}: run `python -m course_utils.data build` to restore it",
                                        "{first}{more}：运行 `python -m course_utils.data build` 恢复数据",
                                        first=first, more=more))
    n = len(__import__("json").loads((root / data.MANIFEST).read_text())["files"])
    return Check("data", "OK", tr("{n} images match the manifest", "{n} 张图像与清单（manifest）一致", n=n))


# The course's settings: environment variables that every notebook (or every launch) reads.
SETTINGS = ("COURSE_DEVICE", "COURSE_BACKEND", "COURSE_LAUNCHER", "COURSE_LANG")


def _settings_set() -> dict[str, str]:
    return {k: os.environ[k] for k in SETTINGS if os.environ.get(k, "").strip()}


def setting_fix(error: str) -> str:
    """What to do when `error` (an exception's text) names a course setting that is set in the
    environment: unset or correct it; "" when it names none."""
    for name, value in _settings_set().items():
        if name in error:
            return tr("{name}={value} is set in your environment and does not work here: unset {name} (or correct "
                      "it), {again}",
                      "你的环境中设置了 {name}={value}，它在这台机器上行不通：请取消设置 {name}（unset {name}，"
                      "或改成正确的值），{again}",
                      name=name, value=value, again=again())
    return ""


def check_settings() -> Check:
    """The course's settings (SETTINGS), tried as the notebooks use them: the device of every first
    cell (``pick_device()``), the engine and backend of every launch (2 ranks). FAIL names the setting."""
    found = _settings_set()
    tries: list[Callable[[], object]] = []
    with contextlib.suppress(ImportError):  # torch missing: the accelerator line says what to do
        from .device import pick_device
        from .dist import check_backend
        from .launch import choose_engine

        tries = [pick_device, lambda: choose_engine(None, 0)]
        if "COURSE_BACKEND" in found:
            tries.append(lambda: check_backend(os.environ["COURSE_BACKEND"], 2, setting="COURSE_BACKEND"))
    for attempt in tries:
        try:
            attempt()
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            fix = setting_fix(text)
            return Check("settings", "FAIL", f"{text.rstrip('.')}: {fix}" if fix else text, fix)
    shown = ", ".join(f"{k}={v}" for k, v in found.items())
    lang = found.get("COURSE_LANG")
    if lang is not None and lang.strip().lower().split(".")[0] not in (
            "en", "english", "zh", "zh-cn", "zh_cn", "chinese"):
        return Check("settings", "WARN", tr(
            "{shown}: COURSE_LANG={lang} is not a language of the course (en, zh); the course speaks English",
            "{shown}：COURSE_LANG={lang} 不是本课程的语言（en、zh）；课程将使用英文", shown=shown, lang=lang))
    return Check("settings", "OK", shown or tr("none of {settings} is set: the course chooses",
                                              "未设置 {settings}：由课程自动选择",
                                              settings=tr(", ", "、").join(SETTINGS)))


def run_checks(pins: dict[str, str] | None = None) -> list[Check]:
    pins = read_pins() if pins is None else pins
    checks = [check_python()]
    for name in ("torch", "torchvision"):
        checks.append(check_package(name, pins.get(name)))
    checks.append(check_other_packages(pins))
    checks += [check_cpu(), check_accelerator(), check_settings(), check_widgets(), check_graphviz()]
    try:
        checks.append(check_data())
    except Exception as exc:  # e.g. Pillow missing
        checks.append(Check("data", "FAIL", tr("could not check the data ({exc}): {fix}",
                                               "无法检查数据（{exc}）：{fix}", exc=exc, fix=fix_install())))
    return checks


def format_line(check: Check, width: int = 0) -> str:
    return f"{check.status:4s}  {check.name:{width}s}  {check.detail}"


def format_table(checks: list[Check], width: int = 0) -> str:
    width = max([width, *(len(c.name) for c in checks)])
    return "\n".join(format_line(c, width) for c in checks)


# --- doctor --workshop: the smallest real work of each chapter, each bounded in time -------------


def again() -> str:
    """How every remedy of --workshop ends."""
    return tr("then run `python -m course_utils doctor --workshop` again",
              "然后再运行一次 `python -m course_utils doctor --workshop`")


def fix_busy() -> str:
    return tr("close other programs so that the computer is not busy (or short of memory), {again}",
              "关闭其他程序，让电脑不那么忙（内存也不那么紧张），{again}", again=again())


@dataclass(frozen=True)
class Item:
    """One piece of real work: `run(seconds)` does it within about `seconds` and returns what it did
    (or raises); `fix()` says what a learner does when it fails (in the course's language)."""

    name: str
    run: Callable[[float], str]
    timeout: float
    fix: Callable[[], str]


def _autograd(seconds: float) -> str:
    import torch

    from .device import pick_device

    device = pick_device()  # as every notebook's first cell, with the learner's COURSE_DEVICE
    x = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    (x**2).sum().backward()
    if not torch.allclose(x.grad, 2 * x.detach()):
        raise RuntimeError(tr("the gradient of sum(x**2) at {values} came out as {grads}",
                              "sum(x**2) 在 {values} 处的梯度算成了 {grads}", values=x.tolist(), grads=x.grad.tolist()))
    return tr("a backward pass on {type}: d/dx sum(x**2) = 2x", "在 {type} 上的一次反向传播：d/dx sum(x**2) = 2x",
              type=device.type)


def _module(seconds: float) -> str:
    import io

    import torch

    from .models import MLP

    model, copy = MLP(hidden_dim=32), MLP(hidden_dim=32)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    copy.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        if not torch.equal(model(x), copy(x)):
            raise RuntimeError(tr("a model loaded from its state_dict computes something else",
                                  "从 state_dict 加载的模型算出了不同的结果"))
    return tr("an MLP's forward pass, and its state_dict saved and loaded",
              "一个 MLP 的前向传播，以及它的 state_dict 的保存和加载")


def _dataloader(seconds: float) -> str:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(32.0).reshape(16, 2), torch.arange(16))
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=2, timeout=seconds)
    seen = sorted(int(i) for _, labels in loader for i in labels)
    if seen != list(range(16)):
        raise RuntimeError(tr("the batches held the items {seen}, not 0-15 once each",
                              "各批次中的样本是 {seen}，而不是 0-15 各一次", seen=seen))
    return tr("a DataLoader with 2 worker processes over 16 items",
              "一个带 2 个 worker 进程的 DataLoader，共 16 个样本")


def _distributed(seconds: float) -> str:
    from . import ROOT
    from .launch import torchrun

    # as the notebooks launch: the learner's COURSE_BACKEND and COURSE_LAUNCHER, if set
    result = torchrun("scripts/hello_dist.py", nproc=2, show=False, timeout=seconds * 0.8, cwd=ROOT / "notebooks")
    if "all_reduce sum of (rank + 1) = 3" not in result.logs[0]:
        raise RuntimeError(tr("rank 0 printed {logs!r}, without its all_reduce",
                              "rank 0 打印了 {logs!r}，其中没有它的 all_reduce 结果", logs=result.logs[0]))
    return tr("2 processes talked over {backend} (scripts/hello_dist.py, {engine} engine)",
              "2 个进程通过 {backend} 完成了通信（scripts/hello_dist.py，{engine} 引擎）",
              backend=result.backend, engine=result.engine)


def _ipywidgets(seconds: float) -> str:
    import ipywidgets

    slider = ipywidgets.IntSlider(value=1, min=0, max=3, description="epoch")
    slider.value = 2
    return tr("ipywidgets {version} made a slider", "ipywidgets {version} 创建了一个滑块",
              version=ipywidgets.__version__)


WORKSHOP = [
    Item("autograd", _autograd, 20.0,
         lambda: tr("PyTorch could not compute a gradient: {fix}, {again}",
                    "PyTorch 无法计算梯度：{fix}，{again}", fix=fix_install(), again=again())),
    Item("module", _module, 20.0,
         lambda: tr("PyTorch could not run or save a small model: {fix}, {again}",
                    "PyTorch 无法运行或保存一个小模型：{fix}，{again}", fix=fix_install(), again=again())),
    Item("dataloader", _dataloader, 20.0,
         lambda: tr("the DataLoader's worker processes did not start or answer: close other programs to free "
                    "memory (in Docker, start the container with --shm-size=1g), {again}",
                    "DataLoader 的 worker 进程没有启动或没有响应：关闭其他程序以释放内存"
                    "（在 Docker 中，请用 --shm-size=1g 启动容器），{again}", again=again())),
    Item("distributed", _distributed, 40.0,
         lambda: tr("2 local processes could not talk to each other: let Python accept local connections in "
                    "your firewall, pause any VPN, check that `ping localhost` answers, {again}",
                    "本机的 2 个进程之间无法通信：请在防火墙中允许 Python 接受本地连接，暂停所有 VPN，"
                    "确认 `ping localhost` 有响应，{again}", again=again())),
    Item("ipywidgets", _ipywidgets, 20.0,
         lambda: tr("sliders will not work in the notebooks: {fix}, {again}",
                    "笔记本中的滑块将无法使用：{fix}，{again}", fix=fix_install(), again=again())),
]


def run_item(item: Item) -> Check:
    """Run `item` on a helper thread and wait at most its timeout: OK or FAIL, with the seconds."""
    outcome: list = []

    def work() -> None:
        try:
            outcome.append((True, item.run(item.timeout)))
        except BaseException as exc:  # reported below, on the main thread
            first = (str(exc).strip().splitlines() or [""])[0]
            outcome.append((False, f"{type(exc).__name__}: {first}" if first else type(exc).__name__))

    start = time.monotonic()
    thread = threading.Thread(target=work, name=f"doctor-{item.name}", daemon=True)
    thread.start()
    thread.join(item.timeout)
    took = time.monotonic() - start
    if not outcome:  # still running: left behind (a daemon thread), the next item goes on
        return Check(item.name, "FAIL", tr("did not finish within {timeout:g} s: {fix}",
                                           "未能在 {timeout:g} 秒内完成：{fix}",
                                           timeout=item.timeout, fix=fix_busy()), fix_busy())
    ok, text = outcome[0]
    if ok:
        return Check(item.name, "OK", tr("{text} ({took:.1f} s)", "{text}（{took:.1f} 秒）", text=text, took=took))
    fix = setting_fix(text) or item.fix()  # a wrong setting of the learner's, named, before generic advice
    return Check(item.name, "FAIL", tr("{text} ({took:.1f} s): {fix}", "{text}（{took:.1f} 秒）：{fix}",
                                       text=text, took=took, fix=fix), fix)


def run_workshop(show: Callable[[Check], None] = lambda check: None) -> list[Check]:
    """The items of WORKSHOP, one after the other; `show` gets each line as soon as it is known."""
    checks = []
    for item in WORKSHOP:
        checks.append(run_item(item))
        show(checks[-1])
    return checks


def verdict(checks: list[Check]) -> str:
    """The line to paste into the workshop chat: READY, or the first failure's remedy. The keywords READY and
    NOT READY, and the check's name, stay the same in every language (instructors look for them)."""
    failed = next((c for c in checks if c.status == "FAIL"), None)
    if failed is None:
        return "READY"
    return f"NOT READY: {failed.name}: {failed.fix or failed.detail}"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m course_utils doctor", description=__doc__.split("\n")[0])
    parser.add_argument("--workshop", action="store_true",
                        help="also run the smallest real work of each chapter; ends with READY or NOT READY")
    o = parser.parse_args(sys.argv[1:] if argv is None else argv)
    checks = run_checks()
    width = max(len(c.name) for c in [*checks, *(WORKSHOP if o.workshop else [])])
    print(format_table(checks, width), flush=True)
    took = 0.0
    if o.workshop:
        start = time.monotonic()
        checks += run_workshop(show=lambda check: print(format_line(check, width), flush=True))
        took = time.monotonic() - start
    fails = sum(c.status == "FAIL" for c in checks)
    warns = sum(c.status == "WARN" for c in checks)
    oks = len(checks) - fails - warns
    print(tr("\n{n_checks} checks: {oks} OK, {warns} WARN, {fails} FAIL",
             "\n共 {n_checks} 项检查：{oks} OK，{warns} WARN，{fails} FAIL",
             n_checks=len(checks), oks=oks, warns=warns, fails=fails))
    if o.workshop:
        print(tr("the workshop checks took {took:.1f} s", "工作坊检查用时 {took:.1f} 秒", took=took))
        print(verdict(checks))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
