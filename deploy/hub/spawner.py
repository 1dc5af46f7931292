"""The learners' servers: JupyterHub's LocalProcessSpawner, each server run as its learner's own system
account (``course-ada`` for the hub user ``ada``), never as the hub user's name itself, so that a learner
who calls themselves ``root`` gets ``course-root``.

What it enforces and what it does not: the account keeps each learner's files and processes apart (home
mode 700, no write access to the course's .venv or the instructor's clone). Memory and CPU are *not*
limited: LocalProcessSpawner starts plain processes, and its ``mem_limit``/``cpu_limit`` only set
``MEM_LIMIT``/``CPU_LIMIT`` for the server to read. The room's threads per kernel (``OMP_NUM_THREADS``,
set from the cores and the learners) keep kernels from oversubscribing the cores when used as taught, not
when a learner sets more. To enforce memory and CPU, use cgroups: jupyterhub-systemdspawner on one
server, or Kubernetes (``deploy/kubernetes/``).

When a server stops (signed out, culled, the hub stopped), every process its account still runs is
stopped too: kernels and the processes they started (DataLoader workers, torchrun ranks) do not outlive
their server.
"""

from __future__ import annotations

import asyncio
import pwd

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Unicode

from . import room


class RoomSpawner(LocalProcessSpawner):
    account_prefix = Unicode(room.ACCOUNT_PREFIX, help="system account = prefix + hub name").tag(config=True)
    group = Unicode(room.GROUP, help="the system group of the learners' accounts").tag(config=True)
    home_base = Unicode("/home", help="where the learners' homes are made").tag(config=True)

    @property
    def account(self) -> str:
        return self.account_prefix + self.user.name

    def make_preexec_fn(self, name):
        return set_user_setuid(self.account)

    def user_env(self, env):
        entry = pwd.getpwnam(self.account)
        env["USER"] = env["LOGNAME"] = self.account
        env["HOME"] = entry.pw_dir
        env["SHELL"] = entry.pw_shell or "/bin/bash"
        return env

    async def start(self):
        await asyncio.to_thread(room.ensure_account, self.account, self.group, self.home_base)
        return await super().start()

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            try:
                uid = pwd.getpwnam(self.account).pw_uid
            except KeyError:
                return
            left = await asyncio.to_thread(room.stop_processes, uid)
            if left:
                self.log.info("Stopped %d processes of %s left by its server", len(left), self.account)
