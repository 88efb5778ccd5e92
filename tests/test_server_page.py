"""The search page in a real headless browser: ``serve`` in a subprocess on 127.0.0.1, Chromium
types a query and the hits render (snippet with highlighted words, channel bars, JSON link).

The screenshot is kept as a test artefact under .cache/test-artifacts/ (its path is printed).
Skipped, saying why, where Chromium, its driver or selenium is absent (.ci/run installs them).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

ARTIFACTS = REPO / ".cache" / "test-artifacts"


def _browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no Chromium / chromedriver on this machine (apt-get install chromium chromium-driver; .ci/run does)")
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra: pip install '.[test]')")
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install '.[serve]'")
    return chromium, driver


class Served(str):
    """The server's URL, with its process (to stop it mid-test)."""

    def __new__(cls, url: str, proc: subprocess.Popen):
        self = super().__new__(cls, url)
        self.proc = proc
        return self


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(toy_corpus, tiny_model_dir, tmp_path):
    """``serve INDEX`` on a free loopback port, over an index of the toy corpus holding the aligned tokens
    beside BM25 and the encoder (the default holds no aligned tokens; the page must explain all three)."""
    from indexer import cli as build_cli

    index = tmp_path / "index"
    assert build_cli.main(["--corpus", str(toy_corpus), "--index", str(index), "--model", str(tiny_model_dir), "--adapter", "none",
                           "--top-k", "16", "--channels", "sparse,bm25,encoder", "--quiet"]) == 0
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "retriever.server.cli", str(index), "--port", str(port)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"serve exited with {proc.returncode}: {log_path.read_text()}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("serve did not answer /healthz within 180 s")
            time.sleep(0.3)
        yield Served(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _chrome():
    chromium, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1100,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_search_page_renders_explained_hits_in_chromium(server):
    browser = _chrome()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        browser.get(server + "/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        modes = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#mode option")]
        assert "hybrid" in modes and "sparse" in modes
        assert "40 documents" in browser.find_element(By.ID, "info").text
        box = browser.find_element(By.ID, "query")
        box.send_keys("cat and dog near the river")
        browser.find_element(By.ID, "go").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#hits li.hit")))
        hits = browser.find_elements(By.CSS_SELECTOR, "#hits li.hit")
        assert len(hits) == 10
        assert browser.find_elements(By.CSS_SELECTOR, "#hits .snippet mark"), "matched words are highlighted"
        marked = {m.text.lower() for m in browser.find_elements(By.CSS_SELECTOR, "#hits .snippet mark")}
        assert marked & {"cat", "dog", "river"}
        shares = browser.find_elements(By.CSS_SELECTOR, "#hits .bar .share")
        assert shares and {s.get_attribute("data-channel") for s in shares} <= {"sparse", "bm25", "encoder", "dense"}
        assert "mode hybrid" in browser.find_element(By.ID, "status").text
        link = browser.find_element(By.ID, "json-link").get_attribute("href")
        assert link.startswith(server + "/search?q=cat+and+dog")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "search-page.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        print(f"\nsearch page screenshot: {shot}")
        browser.get(link)  # the JSON behind the page
        assert '"hits"' in browser.find_element(By.TAG_NAME, "body").text
    finally:
        browser.quit()


def test_the_query_is_in_the_url_back_works_and_a_dead_server_is_said(server):
    browser = _chrome()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def first_title() -> str:  # read in one go: the list may be redrawn between a find and a read
        return browser.execute_script("const e = document.querySelector('#hits li.hit'); return e ? e.textContent : '';")

    try:
        wait = WebDriverWait(browser, 60)
        browser.get(server + "/?q=computer+memory")  # a bookmark: the search runs on opening
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#hits li.hit"))
        assert browser.find_element(By.ID, "query").get_attribute("value") == "computer memory"
        info = browser.find_element(By.ID, "info").text
        assert "model tiny-model" in info and "/" not in info.split("model", 1)[1]  # names, never a local path
        computer = first_title()
        box = browser.find_element(By.ID, "query")
        box.clear()
        box.send_keys("snow on the mountain")
        browser.find_element(By.ID, "go").click()
        wait.until(lambda b: "q=snow+on+the+mountain" in b.current_url and b.find_elements(By.CSS_SELECTOR, "#hits li.hit")
                   and first_title() != computer)
        assert len(browser.find_elements(By.CSS_SELECTOR, "#hits li.hit")) == 10
        browser.find_element(By.ID, "more").click()  # the next page, through offset
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#hits li.hit")) == 20)
        browser.back()
        wait.until(lambda b: b.find_element(By.ID, "query").get_attribute("value") == "computer memory" and first_title() == computer)
        assert "q=computer+memory" in browser.current_url
        browser.forward()
        wait.until(lambda b: b.find_element(By.ID, "query").get_attribute("value") == "snow on the mountain")
        server.proc.terminate()  # the server goes away: the page says so instead of "searching…"
        server.proc.wait(10)
        browser.find_element(By.ID, "go").click()
        wait.until(lambda b: "cannot be reached" in b.find_element(By.ID, "status").text)
    finally:
        browser.quit()


def test_page_is_served_from_the_package():
    from importlib import resources

    static = resources.files("retriever.server") / "static"
    assert all((static / name).is_file() for name in ("index.html", "app.js", "style.css"))
    assert Path(str(static / "index.html")).read_text(encoding="utf-8").count("/static/app.js") == 1
