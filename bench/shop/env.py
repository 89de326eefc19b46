# ruff: noqa: UP006, UP035, UP045  (written in the typing style of LLM-written EnvScaler classes)
from typing import Any, Dict, List, Literal, Optional, TypedDict


class UserInfo(TypedDict):
    user_id: str
    name: str
    email: str
    tier: Literal["basic", "gold"]
    order_ids: List[str]


class ProductInfo(TypedDict):
    product_id: str
    name: str
    price: float
    stock: int


class OrderInfo(TypedDict):
    order_id: str
    user_id: str
    product_id: str
    quantity: int
    status: Literal["processing", "shipped", "delivered", "cancelled"]


class ShopDesk:
    """A shop's customer desk: users, their orders and the products they bought."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Users: {user_id: UserInfo}
        self.users: Dict[str, UserInfo] = {}
        # Products: {product_id: ProductInfo}
        self.products: Dict[str, ProductInfo] = {}
        # Orders: {order_id: OrderInfo}
        self.orders: Dict[str, OrderInfo] = {}

    def get_user_details(self, user_id: str) -> dict:
        """Look up one user's profile.

        Args:
            user_id: The user's id, for example "U0001".

        Returns:
            dict: {"success": True, "data": UserInfo} or {"success": False, "error": str}
        """
        user = self.users.get(user_id)
        if user is None:
            return {"success": False, "error": f"user {user_id} not found"}
        return {"success": True, "data": dict(user)}

    def get_order(self, order_id: str) -> dict:
        """Look up one order.

        Args:
            order_id: The order's id, for example "O0001".

        Returns:
            dict: {"success": True, "data": OrderInfo} or {"success": False, "error": str}
        """
        order = self.orders.get(order_id)
        if order is None:
            return {"success": False, "error": f"order {order_id} not found"}
        return {"success": True, "data": dict(order)}

    def update_order_status(self, order_id: str, status: str) -> dict:
        """Move an order to a new status. Cancelled and delivered orders are final.

        Args:
            order_id: The order's id.
            status: One of "processing", "shipped", "delivered", "cancelled".

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}
        """
        order = self.orders.get(order_id)
        if order is None:
            return {"success": False, "error": f"order {order_id} not found"}
        if status not in ("processing", "shipped", "delivered", "cancelled"):
            return {"success": False, "error": f"unknown status {status}"}
        if order["status"] in ("delivered", "cancelled"):
            return {"success": False, "error": f"order {order_id} is {order['status']} and cannot change"}
        order["status"] = status
        return {"success": True, "message": f"order {order_id} is now {status}"}
