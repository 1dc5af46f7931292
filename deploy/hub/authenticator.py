"""The room's sign-in: JupyterHub's SharedPasswordAuthenticator, with the room password used once.

The instructor writes the room password on the board. A learner signs in the first time with a name of
their choice, a password of their own and the room password (the login form's third field): the name is
theirs from then on, and only their own password opens it. Without that step, anyone who knows the room
password could sign in as any learner (``SharedPasswordAuthenticator`` says so of itself), and the
accounts that keep learners' files apart would keep nobody out. The instructor signs in with the admin
password (``admin_users``), as ``SharedPasswordAuthenticator`` does it.

``RoomPasswordAuthenticator`` is the sign-in alone (what Kubernetes uses, where each learner's server is
a pod of its own); ``RoomAuthenticator`` adds the system account of each learner on one server: on first
sign-in the hub user ``ada`` gets ``course-ada`` (see ``room.ensure_account``).
"""

from __future__ import annotations

import asyncio
from secrets import compare_digest

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from jupyterhub.handlers.login import LoginHandler
from traitlets import Unicode, default

from course_utils.i18n import speaking, tr

from . import room


class SignInRefused(Exception):
    """A sign-in refused with a reason the learner can act on (shown on the login form)."""


class RoomLoginHandler(LoginHandler):
    """The hub's login form, which shows why a sign-in was refused instead of a bare error page."""

    async def post(self):
        try:
            return await super().post()
        except SignInRefused as refused:
            self.set_status(403)
            username = self.get_argument("username", default="", strip=True)[:32]
            self.finish(await self._render(login_error=str(refused), username=username))


class RoomPasswordAuthenticator(SharedPasswordAuthenticator):
    """Room password to take a name, the learner's own password after that."""

    claims_file = Unicode(help="the JSON file of names taken and their own passwords (room.Claims)").tag(config=True)
    lang = Unicode("en", help="the language of the messages: en or zh").tag(config=True)

    @default("request_otp")
    def _request_otp(self):
        return True  # the form's third field, used here for the room password

    @default("otp_prompt")
    def _otp_prompt(self):
        return "Room password (first sign-in only) / 教室密码（仅首次登录）:"

    @default("allow_all")
    def _allow_all(self):
        return True  # whoever passes authenticate(): the room password, then their own

    @default("username_pattern")
    def _username_pattern(self):
        return f"^{room.NAME_PATTERN}$"

    def get_handlers(self, app):
        return [("/login", RoomLoginHandler)]

    def _say(self, en: str, zh: str) -> str:
        with speaking(self.lang):
            return tr(en, zh)

    async def authenticate(self, handler, data):
        name = self.normalize_username(str(data.get("username", "")).strip())
        password = str(data.get("password", ""))
        if name in self.admin_users:
            return await super().authenticate(handler, data)  # the admin password
        if not room.valid_name(name):
            raise SignInRefused(self._say(
                "A name is 1 to 23 lower-case letters, digits, - or _, starting with a letter (ada, li-wei, team_3).",
                "名字由 1 到 23 个小写字母、数字、- 或 _ 组成，并以字母开头（如 ada、li-wei、team_3）。"))
        claims = room.Claims(self.claims_file)
        if claims.taken(name):
            if await asyncio.to_thread(claims.verify, name, password):
                return {"name": name, "admin": False}
            raise SignInRefused(self._say(
                f"The name {name} is taken and this is not its password. Type your own password, or pick another name.",
                f"名字 {name} 已被使用，而这不是它的密码。请输入你自己的密码，或换一个名字。"))
        room_password = str(data.get("otp", ""))
        if not self.user_password or not room_password:
            raise SignInRefused(self._say(
                f"The name {name} is free. To take it, type the room password your instructor gave you in the "
                "third field, and choose your own password (you will type it to sign in again).",
                f"名字 {name} 还没有人用。"
                "要使用它，请在第三个输入框中填写讲师给的教室密码，并设置你自己的密码（以后用它登录）。"))
        if not self._same(room_password, self.user_password):
            raise SignInRefused(self._say("The room password is not right: ask your instructor.",
                                          "教室密码不对：请问讲师。"))
        if len(password) < room.PASSWORD_MIN or self._same(password, self.user_password):
            raise SignInRefused(self._say(
                f"Choose a password of your own, at least {room.PASSWORD_MIN} characters, not the room password.",
                f"请设置你自己的密码：至少 {room.PASSWORD_MIN} 个字符，且不能与教室密码相同。"))
        try:
            await asyncio.to_thread(claims.claim, name, password)
        except ValueError:  # taken a moment ago by someone else
            raise SignInRefused(self._say(f"The name {name} was just taken: pick another one.",
                                          f"名字 {name} 刚刚被别人用了：请换一个。")) from None
        self.log.info("%s took the name %s", handler.request.remote_ip if handler else "someone", name)
        return {"name": name, "admin": False}

    @staticmethod
    def _same(a: str, b: str) -> bool:
        return compare_digest(a.encode(), b.encode())


class RoomAuthenticator(RoomPasswordAuthenticator):
    """The room's sign-in on one server, with one system account per learner."""

    account_prefix = Unicode(room.ACCOUNT_PREFIX, help="system account = prefix + hub name").tag(config=True)
    group = Unicode(room.GROUP, help="the system group of the learners' accounts").tag(config=True)
    home_base = Unicode("/home", help="where the learners' homes are made").tag(config=True)

    async def add_user(self, user):
        """A user's first sign-in (and every user at the hub's start): their system account."""
        await asyncio.to_thread(room.ensure_account, self.account_prefix + user.name, self.group, self.home_base)
        super().add_user(user)
