"""A Streamlit session without a browser: the app's own websocket protocol, for load tests.

A browser's Streamlit frontend talks to the server over one websocket, /_stcore/stream: it sends
`BackMsg` protobufs (a `rerun_script` with the page, the query string and widget states: a
button click is a `trigger_value`) and receives `ForwardMsg`s (a `new_session`, the page's
elements as deltas, `page_info_changed` when the query string changes, and `script_finished`
when the run is over). `LabSession` speaks the same messages, so a server can be measured with
many sessions at a time without a browser for each (bench/load.py, tests/test_deploy.py).

What it sends for a click is what the frontend sends, minus the values of widgets it did not
touch: Streamlit then keeps their values from the last run (`SessionState._old_state`), so the
server runs the same script with the same state. It reports, like the frontend, the cached
messages it has seen, so the server answers repeats with a reference instead of the payload.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import connect

FINISHED = ForwardMsg.ScriptFinishedStatus
REPLICA_HEADER = "X-Lab-Replica"  # deploy/nginx.conf names the replica that answered


@dataclass(frozen=True)
class Run:
    """One script run as the server reported it."""

    seconds: float  # from sending the BackMsg to the run's script_finished ForwardMsg
    step: int | None  # the step slider's value after the run (None: the page has none)
    error: str | None  # an exception shown on the page, a failed run or a timeout


class LabSession:
    """One user's tab on one page (e.g. "block_tables", query "seed=3&output_len=12").

    Call `open()` first, then `click("forward" | "back" | "reset")`, `reconnect()`, `close()`.
    """

    def __init__(self, base_url: str, page: str, query: str = "", *,
                 timeout_s: float = 120.0) -> None:
        self.base_url, self.page, self.timeout_s = base_url.rstrip("/"), page, timeout_s
        self.query_string = query
        self.session_id = ""
        self.replicas: set[str] = set()  # every X-Lab-Replica header seen (behind nginx)
        self.cookie = ""  # what the page's response set (nginx's sticky cookie), sent back
        self.step: int | None = None
        self.last_step: int | None = None
        self._ws = None
        self._reader: asyncio.Task | None = None
        self._page_hash = ""
        self._widget_ids: dict[str, str] = {}  # widget key -> Streamlit's widget id
        self._cached: set[str] = set()  # hashes of cacheable messages received
        self._finished: asyncio.Future | None = None
        self._errors: list[str] = []

    async def open(self) -> Run:
        """Load the page as a browser does (the HTML, which sets any sticky cookie), connect
        the websocket and run the page's script for the first time."""
        await asyncio.to_thread(self._get_page)
        await self._connect()
        return await self._run(page_name=self.page)

    async def click(self, control: str) -> Run:
        """Press a step control (its widget key is step_<control>) and wait for the rerun."""
        widget_id = self._widget_ids[f"step_{control}"]
        return await self._run(trigger=widget_id)

    async def reconnect(self) -> Run:
        """Drop the websocket and connect again with this session's id, as the frontend does
        after a network blip; then rerun the page. The server resumes the session only if the
        connection reaches the replica that holds it."""
        await self._disconnect()
        await self._connect()
        return await self._run()

    async def close(self) -> None:
        await self._disconnect()

    def _get_page(self) -> None:
        url = f"{self.base_url}/{self.page}" + (f"?{self.query_string}" if self.query_string
                                                else "")
        with urllib.request.urlopen(urllib.request.Request(url, headers=self._headers()),
                                    timeout=self.timeout_s) as response:
            self._note_replica(response.headers)
            cookies = response.headers.get_all("Set-Cookie") or []
            self.cookie = "; ".join(c.split(";", 1)[0] for c in cookies)

    def _headers(self) -> dict[str, str]:
        return {"Cookie": self.cookie} if self.cookie else {}

    def _note_replica(self, headers) -> None:
        if headers.get(REPLICA_HEADER):
            self.replicas.add(headers[REPLICA_HEADER])

    async def _connect(self) -> None:
        # The frontend's subprotocol list: "streamlit", an XSRF token (none here), and the
        # session to resume (the server reads the entries by position).
        protocols = ["streamlit", "no-xsrf"] + ([self.session_id] if self.session_id else [])
        url = self.base_url.replace("http", "ws", 1) + "/_stcore/stream"
        self._ws = await connect(url, subprotocols=protocols, max_size=None,
                                 additional_headers=self._headers(), open_timeout=self.timeout_s)
        self._note_replica(self._ws.response.headers)
        self._reader = asyncio.create_task(self._read(self._ws))

    async def _disconnect(self) -> None:
        if self._ws is not None:
            await self._ws.close()  # the closing handshake waits at most close_timeout
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._ws = None

    async def _run(self, *, page_name: str = "", trigger: str = "") -> Run:
        message = BackMsg()
        state = message.rerun_script
        state.SetInParent()
        state.query_string = self.query_string
        state.page_script_hash = self._page_hash
        state.page_name = page_name if not self._page_hash else ""
        state.cached_message_hashes.extend(sorted(self._cached))
        if trigger:
            state.widget_states.widgets.add(id=trigger, trigger_value=True)
        self._errors = []
        self._finished = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        await self._ws.send(message.SerializeToString())
        try:
            await asyncio.wait_for(asyncio.shield(self._finished), self.timeout_s)
        except TimeoutError:
            self._errors.append(f"no script_finished within {self.timeout_s:g} s")
        except ConnectionError as error:
            self._errors.append(f"connection lost: {error}")
        seconds = time.perf_counter() - start
        return Run(seconds, self.step, "; ".join(self._errors) or None)

    async def _read(self, ws) -> None:
        try:
            async for payload in ws:
                self._receive(ForwardMsg.FromString(payload))
        except Exception as error:  # the connection dropped: whoever waits learns why
            self._fail(ConnectionError(repr(error)))
        else:
            self._fail(ConnectionError("websocket closed"))

    def _fail(self, error: Exception) -> None:
        if self._finished is not None and not self._finished.done():
            self._finished.set_exception(error)
            self._finished.exception()  # marked retrieved: the waiter may have timed out

    def _receive(self, msg: ForwardMsg) -> None:
        if msg.metadata.cacheable:
            self._cached.add(msg.hash)
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self.session_id = msg.new_session.initialize.session_id or self.session_id
        elif kind == "navigation":  # st.navigation names the page that ran, by its hash
            self._page_hash = msg.navigation.page_script_hash
        elif kind == "page_not_found":
            self._errors.append(f"page not found: {msg.page_not_found.page_name}")
        elif kind == "page_info_changed":
            self.query_string = msg.page_info_changed.query_string
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            self._element(msg.delta.new_element)
        elif kind == "script_finished" and msg.script_finished in (
                FINISHED.FINISHED_SUCCESSFULLY, FINISHED.FINISHED_WITH_COMPILE_ERROR):
            if msg.script_finished == FINISHED.FINISHED_WITH_COMPILE_ERROR:
                self._errors.append("the script did not compile")
            if self._finished is not None and not self._finished.done():
                self._finished.set_result(None)

    def _element(self, element) -> None:
        kind = element.WhichOneof("type")
        if kind == "exception":
            self._errors.append(f"{element.exception.type}: {element.exception.message}")
            return
        widget = getattr(element, kind, None)
        widget_id = getattr(widget, "id", "")
        if not widget_id.startswith("$$ID-"):
            return
        key = widget_id.split("-", 2)[2]  # "$$ID-<hash>-<key>"
        self._widget_ids[key] = widget_id
        if key == "step" and kind == "slider":
            # Without set_value the frontend keeps the value it has; the default is only the
            # value a new slider starts at.
            if widget.set_value or self.step is None:
                self.step = int((widget.value if widget.set_value else widget.default)[0])
            self.last_step = int(widget.max)


def query(**params: object) -> str:
    """A page's query string from its link parameters."""
    return urllib.parse.urlencode(params)
