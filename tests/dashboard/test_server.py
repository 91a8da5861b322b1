"""The dashboard's server side without a browser: pages, headers, rendering, costs, titles."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import aiohttp
from pygments.styles import get_style_by_name

from metis.dashboard.render import CODE_STYLES, render_markdown
from metis.server.runner import Daemon
from tests.api import Api, browser_secret_of, key_headers


def test_render_escapes_raw_html_and_strips_dangerous_links() -> None:
    html = render_markdown(
        "<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1)) "
        '<a href="javascript:alert(1)">y</a> [ok](https://example.org)\n\n'
        "```python\ndef f():\n    return 1\n```\n"
    )
    assert "<script" not in html and "<img" not in html
    assert '<a href="javascript' not in html and "&lt;script&gt;" in html
    assert 'href="https://example.org"' in html
    assert 'rel="noopener noreferrer nofollow"' in html
    assert '<span class="hl-k">def</span>' in html


def test_render_keeps_a_tables_column_alignment_as_align() -> None:
    html = render_markdown("| a | b | c | d |\n|:--|--:|:-:|---|\n| 1 | 2 | 3 | 4 |\n")
    assert '<th align="right">b</th>' in html and '<td align="center">3</td>' in html
    assert '<td align="left">1</td>' in html and "<td>4</td>" in html
    assert "style" not in html


def test_an_image_in_a_reply_is_a_link_naming_it_and_never_loaded() -> None:
    html = render_markdown(
        '![the <b>build</b> graph](https://img.example/g.png "t") '
        "![](https://img.example/x.png) ![pixel](data:image/png;base64,AAAA)"
    )
    assert "<img" not in html
    assert '<a href="https://img.example/g.png" rel="noopener noreferrer nofollow">' in html
    assert "image: the &lt;b&gt;build&lt;/b&gt; graph</a>" in html
    assert ">image: https://img.example/x.png</a>" in html  # no description: its address
    assert "data:" not in html and ">image: pixel</a>" in html


def _luminance(colour: str) -> float:
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_every_colour_of_highlighted_code_reads_against_its_background() -> None:
    """WCAG's 4.5:1 for text, in the light and the dark theme."""
    for name in CODE_STYLES:
        style = get_style_by_name(name)
        background = _luminance(style.background_color)
        for token, rules in style:
            if rules["color"]:
                lighter, darker = sorted((_luminance(f"#{rules['color']}"), background))[::-1]
                assert (lighter + 0.05) / (darker + 0.05) >= 4.5, (name, token, rules["color"])


async def test_pages_and_static_files(daemon: Daemon) -> None:
    async with aiohttp.ClientSession(base_url=daemon.base_url) as anon:
        async with anon.get("/") as r:
            assert r.status == 200
            body = await r.text()
            # the same page for everyone: its script shows the app or how to log in
            assert "metis open" in body and "/static/js/main.js" in body
            csp = r.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert r.headers["X-Frame-Options"] == "DENY"
        async with anon.get("/static/js/main.js") as r:
            assert r.status == 200 and r.content_type == "text/javascript"
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        async with anon.get("/static/highlight.css") as r:
            assert r.status == 200 and ".hl-k" in await r.text()
        for missing in ("/static/nope.js", "/static/../auth.py", "/static/index.html"):
            async with anon.get(missing) as r:
                assert r.status in (401, 404), missing
        async with anon.post("/render/markdown", json={"markdown": ["x"]}) as r:
            assert r.status == 401


async def test_a_browser_sent_to_no_route_gets_a_page_and_an_api_client_the_json(
    daemon: Daemon,
) -> None:
    navigate = {"Sec-Fetch-Mode": "navigate"}
    async with aiohttp.ClientSession(base_url=daemon.base_url) as anon:
        async with anon.get("/nowhere", headers=navigate) as r:
            assert (r.status, r.content_type) == (404, "text/html")
            assert "no page at this address" in await r.text()
            assert r.headers["Content-Security-Policy"].startswith("default-src 'self'")
        async with anon.get("/nowhere") as r:  # not a navigation: the API's refusal
            assert (r.status, (await r.json())["error"]["code"]) == (401, "unauthorized")
        async with anon.get("/sessions", headers=navigate) as r:  # a route: its key is asked
            assert (r.status, (await r.json())["error"]["code"]) == (401, "unauthorized")
        async with anon.post("/nowhere", headers=navigate) as r:
            assert r.status == 401
        async with anon.get("/nowhere", headers={**navigate, "Host": "evil.example"}) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (403, "host_not_allowed")


async def test_logged_in_page_render_endpoint_and_openapi(daemon: Daemon) -> None:
    async with (
        aiohttp.ClientSession() as anonymous,
        anonymous.get(daemon.login_url(), allow_redirects=False) as r,
    ):
        assert r.status == 303
        secret = browser_secret_of(r.headers["Location"])
    async with aiohttp.ClientSession(headers=key_headers(secret)) as browser:
        origin = {"Origin": daemon.base_url}
        async with browser.post(
            daemon.base_url + "/render/markdown",
            json={"markdown": ["**b** <b onclick=x>"]},
            headers=origin,
        ) as r:
            assert r.status == 200
            assert (await r.json())["html"] == ["<p><strong>b</strong> &lt;b onclick=x&gt;</p>\n"]
        async with browser.get(daemon.base_url + "/openapi.json") as r:
            paths = (await r.json())["paths"]
            assert "/render/markdown" in paths and "/costs" in paths


async def test_session_list_titles_status_and_costs(
    http: aiohttp.ClientSession, workspace: Path
) -> None:
    api = Api(http)
    session = await api.create_session(workspace)
    status, listed = await api.call("GET", "/sessions")
    assert status == 200
    item = listed["sessions"][0]
    assert item["title"] is None and item["status"] == "active"
    status, _ = await api.submit(session["id"], "hello **there**")
    assert status == 202
    await api.wait_for_event(session["id"], lambda e: e["type"] == "turn.completed")
    _, listed = await api.call("GET", "/sessions")
    assert listed["sessions"][0]["title"] == "hello **there**"
    status, costs = await api.call("GET", "/costs", params={"days": 7})
    assert status == 200
    assert len(costs["by_day"]) == 7
    assert costs["by_model"][0]["key"] == "local:scripted"
    assert costs["by_session"][0]["turns"] == 1
    assert costs["by_session"][0]["title"] == "hello **there**"  # known by its title
    assert "title" not in costs["by_model"][0]
    assert costs["total_usd"] == "0"
    # days begin at the browser's midnight: 25 hours apart, two zones never share a date
    for zone in ("Pacific/Kiritimati", "Pacific/Pago_Pago"):
        status, costs = await api.call("GET", "/costs", params={"days": 2, "tz": zone})
        today = datetime.now(ZoneInfo(zone)).date()
        assert [d["key"] for d in costs["by_day"]] == [str(today - timedelta(days=1)), str(today)]
        assert costs["by_day"][1]["turns"] == 1 and costs["since"] == str(today - timedelta(1))
    status, refused = await api.call("GET", "/costs", params={"tz": "Mars/Olympus_Mons"})
    assert (status, refused["error"]["code"]) == (400, "validation_error")
    assert "unknown time zone: 'Mars/Olympus_Mons'" in str(refused["error"]["details"])
