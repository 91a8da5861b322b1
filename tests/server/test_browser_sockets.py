"""Which browser session opened which WebSocket, so that its logout closes them."""

from metis.server.browser_sockets import SocketsByLogin


class Socket:
    def __init__(self) -> None:
        self.closed_with: tuple[int, str] | None = None

    def close_out_of_band(self, ws_code: int, code: str) -> None:
        self.closed_with = (ws_code, code)


def test_a_logout_closes_the_sockets_its_tokens_opened_and_no_others() -> None:
    sockets = SocketsByLogin()
    sockets.minted("t1", "alice", 60)
    sockets.minted("t2", "bob", 60)
    hers, his = Socket(), Socket()
    sockets.opened("t1", hers)
    sockets.opened("t2", his)
    assert sockets.logged_out("alice") == 1
    assert hers.closed_with == (1008, "logged_out") and his.closed_with is None


def test_a_socket_closed_before_the_logout_is_not_closed_again() -> None:
    sockets = SocketsByLogin()
    sockets.minted("t1", "alice", 60)
    socket = Socket()
    forget = sockets.opened("t1", socket)
    forget()
    assert sockets.logged_out("alice") == 0 and socket.closed_with is None


def test_tokens_forgotten_once_expired_file_nothing() -> None:
    now = [0.0]
    sockets = SocketsByLogin(clock=lambda: now[0])
    sockets.minted("old", "alice", 10)
    now[0] = 20.0
    sockets.minted("new", "alice", 10)  # a mint drops the expired ones
    unfiled, filed = Socket(), Socket()
    sockets.opened("old", unfiled)
    sockets.opened("new", filed)
    assert sockets.logged_out("alice") == 1
    assert unfiled.closed_with is None and filed.closed_with == (1008, "logged_out")
