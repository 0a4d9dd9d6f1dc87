"""A live FastAPI app (served by uvicorn in a thread on loopback) whose OpenAPI document is imported as tools:
typed responses with `$ref`s into components, an array response, one that breaks its own schema, and a
cacheable item that counts its requests."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Self

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tests.support.waiting import Budget
from worker.dev.embedded import free_port


class Item(BaseModel):
    id: int
    name: str
    tags: list[str] = []


class Page(BaseModel):
    items: list[Item]
    total: int


def shop_app(hits: Counter[str]) -> FastAPI:
    app = FastAPI(title="shop")

    @app.get("/items/{item_id}", response_model=Item, tags=["items"], operation_id="get_item")
    async def get_item(item_id: int) -> Item:
        return Item(id=item_id, name=f"item {item_id}", tags=["new"])

    @app.get("/items", response_model=list[Item], tags=["items"], operation_id="list_items")
    async def list_items(count: int = 3) -> list[Item]:
        return [Item(id=n, name=f"item {n}") for n in range(count)]

    @app.get("/pages", response_model=Page, tags=["items"], operation_id="get_page")
    async def get_page() -> Page:
        return Page(items=[Item(id=1, name="one")], total=1)

    @app.get("/broken", responses={200: {"model": Item}}, tags=["items"], operation_id="get_broken")
    async def get_broken() -> JSONResponse:
        return JSONResponse({"id": "not a number", "name": 7})

    @app.get("/cached/{item_id}", response_model=Item, tags=["cached"], operation_id="get_cached")
    async def get_cached(item_id: int) -> Item:
        hits[f"/cached/{item_id}"] += 1
        return Item(id=item_id, name=f"cached {item_id}")

    return app


class ShopServer:
    """uvicorn serving the shop on 127.0.0.1 in a thread."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.port = free_port()
        config = uvicorn.Config(
            shop_app(self.hits), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off", ws="none"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self.thread.start()
        budget = Budget(20)
        while not self.server.started:
            if budget.exhausted() or not self.thread.is_alive():
                raise RuntimeError("the shop app did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
