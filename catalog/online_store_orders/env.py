from typing import Any, Dict, List, Literal, Optional, Set, TypedDict


class CustomerInfo(TypedDict):
    customer_id: str
    name: str
    email: str
    status: Literal["active", "blocked"]


class ProductInfo(TypedDict):
    product_id: str
    name: str
    price: float
    stock: int


class CouponInfo(TypedDict):
    code: str
    percent_off: float
    active: bool


class OrderLine(TypedDict):
    product_id: str
    quantity: int


class OrderItem(TypedDict):
    product_id: str
    quantity: int
    unit_price: float


class OrderInfo(TypedDict):
    order_id: str
    customer_id: str
    items: List[OrderItem]
    subtotal: float
    discount: float
    total: float
    coupon_code: Optional[str]
    status: Literal["pending", "paid", "shipped", "cancelled"]
    paid_amount: float
    refunded_amount: float
    carrier: Optional[str]
    tracking_number: Optional[str]
    cancel_reason: Optional[str]


class RefundInfo(TypedDict):
    refund_id: str
    order_id: str
    amount: float
    reason: str


class OnlineStoreOrderSystem:
    """Order desk of an online shop: customers, stock, orders, payments and refunds."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Customers: {customer_id: CustomerInfo}
        self.customers: Dict[str, CustomerInfo] = {}
        # Products: {product_id: ProductInfo}; stock is reserved when an order is placed
        self.products: Dict[str, ProductInfo] = {}
        # Coupons: {code: CouponInfo}
        self.coupons: Dict[str, CouponInfo] = {}
        # Orders: {order_id: OrderInfo}
        self.orders: Dict[str, OrderInfo] = {}
        # Refunds: {refund_id: RefundInfo}
        self.refunds: Dict[str, RefundInfo] = {}
        # Coupon codes already redeemed; every coupon is single-use store-wide
        self.used_coupons: Set[str] = set()
        config = init_config if isinstance(init_config, dict) else {}
        for order in (config.get("orders") or {}).values():
            if isinstance(order, dict) and order.get("coupon_code"):
                self.used_coupons.add(str(order["coupon_code"]))
        self.used_coupons.update(str(code) for code in (config.get("used_coupons") or []))

    # ------------------------------------------------------------------ helpers

    def _used_coupon_set(self) -> Set[str]:
        # The attribute may have been replaced by a plain list from a JSON config.
        if not isinstance(self.used_coupons, set):
            self.used_coupons = set(self.used_coupons or [])
        return self.used_coupons

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _next_id(self, prefix: str, table: Dict[str, Any]) -> str:
        n = len(table) + 1
        while f"{prefix}{n:04d}" in table:
            n += 1
        return f"{prefix}{n:04d}"

    def _restock(self, order: OrderInfo) -> None:
        for item in order.get("items", []):
            product = self.products.get(item.get("product_id", ""))
            if product is not None:
                product["stock"] = product.get("stock", 0) + int(item.get("quantity", 0))

    # ------------------------------------------------------------------ queries

    def get_customer(self, customer_id: str) -> dict:
        """Look up a customer account.

        Args:
            customer_id: The customer's id, e.g. "C001".

        Returns:
            dict: {"success": True, "data": CustomerInfo} or
            {"success": False, "error": str} when the customer does not exist.
        """
        customer = self._lookup(self.customers, customer_id)
        if customer is None:
            return {"success": False, "error": f"Customer '{customer_id}' not found"}
        return {"success": True, "data": dict(customer)}

    def search_products_by_name(self, query: str, in_stock_only: bool = False) -> dict:
        """Find products whose name contains the query (case-insensitive).

        Args:
            query: Part of the product name.
            in_stock_only: If True, only return products with stock left.

        Returns:
            dict: {"success": True, "data": List[ProductInfo]} (possibly empty) or
            {"success": False, "error": str} when the query is empty.
        """
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "error": "Query must be a non-empty string"}
        needle = query.strip().lower()
        results = [
            dict(p) for p in self.products.values()
            if needle in str(p.get("name", "")).lower() and (not in_stock_only or p.get("stock", 0) > 0)
        ]
        return {"success": True, "data": results}

    def get_product(self, product_id: str) -> dict:
        """Get a product's price and stock.

        Args:
            product_id: The product's id, e.g. "P001".

        Returns:
            dict: {"success": True, "data": ProductInfo} or
            {"success": False, "error": str} when the product does not exist.
        """
        product = self._lookup(self.products, product_id)
        if product is None:
            return {"success": False, "error": f"Product '{product_id}' not found"}
        return {"success": True, "data": dict(product)}

    def get_order(self, order_id: str) -> dict:
        """Get an order with its items, amounts, status and refunds.

        Args:
            order_id: The order's id, e.g. "O0001".

        Returns:
            dict: {"success": True, "data": OrderInfo plus "refunds" (List[RefundInfo])} or
            {"success": False, "error": str} when the order does not exist.
        """
        order = self._lookup(self.orders, order_id)
        if order is None:
            return {"success": False, "error": f"Order '{order_id}' not found"}
        data = dict(order)
        data["items"] = [dict(i) for i in order.get("items", [])]
        data["refunds"] = [dict(r) for r in self.refunds.values() if r.get("order_id") == order_id]
        return {"success": True, "data": data}

    def list_customer_orders(
        self,
        customer_id: str,
        status: Optional[Literal["pending", "paid", "shipped", "cancelled"]] = None,
    ) -> dict:
        """List a customer's orders, optionally only those in one status.

        Args:
            customer_id: The customer's id.
            status: Only return orders in this status; all orders when omitted.

        Returns:
            dict: {"success": True, "data": List[OrderInfo]} or
            {"success": False, "error": str} for an unknown customer or status.
        """
        if self._lookup(self.customers, customer_id) is None:
            return {"success": False, "error": f"Customer '{customer_id}' not found"}
        if status is not None and status not in ("pending", "paid", "shipped", "cancelled"):
            return {"success": False, "error": f"Unknown order status '{status}'"}
        results = [
            dict(o) for o in self.orders.values()
            if o.get("customer_id") == customer_id and (status is None or o.get("status") == status)
        ]
        return {"success": True, "data": results}

    # ------------------------------------------------------------ state changes

    def place_order(
        self,
        customer_id: str,
        items: List[OrderLine],
        coupon_code: Optional[str] = None,
    ) -> dict:
        """Create a pending order and reserve its stock.

        Each item is {"product_id": str, "quantity": int}. A quantity may not
        exceed the product's stock. A coupon must exist, be active and never
        have been used before; it takes its percentage off the subtotal.

        Args:
            customer_id: The ordering customer (must be active).
            items: The order lines, each {"product_id": str, "quantity": int} (at least one line).
            coupon_code: Optional discount code.

        Returns:
            dict: {"success": True, "data": OrderInfo} with the new order, or
            {"success": False, "error": str}; nothing changes on failure.
        """
        customer = self._lookup(self.customers, customer_id)
        if customer is None:
            return {"success": False, "error": f"Customer '{customer_id}' not found"}
        if customer.get("status") != "active":
            return {"success": False, "error": f"Customer '{customer_id}' is blocked and cannot order"}
        if not isinstance(items, list) or not items:
            return {"success": False, "error": "An order needs at least one item"}
        wanted: Dict[str, int] = {}
        for line in items:
            if not isinstance(line, dict):
                return {"success": False, "error": "Each item must be an object with product_id and quantity"}
            product_id = line.get("product_id")
            quantity = line.get("quantity")
            if self._lookup(self.products, product_id) is None:
                return {"success": False, "error": f"Product '{product_id}' not found"}
            if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
                return {"success": False, "error": f"Quantity for '{product_id}' must be a positive integer"}
            wanted[product_id] = wanted.get(product_id, 0) + quantity
        for product_id, quantity in wanted.items():
            stock = self.products[product_id].get("stock", 0)
            if quantity > stock:
                return {"success": False, "error": f"Only {stock} of '{product_id}' in stock, {quantity} requested"}
        percent_off = 0.0
        if coupon_code is not None:
            coupon = self._lookup(self.coupons, coupon_code)
            if coupon is None or not coupon.get("active"):
                return {"success": False, "error": f"Coupon '{coupon_code}' is not valid"}
            if coupon_code in self._used_coupon_set():
                return {"success": False, "error": f"Coupon '{coupon_code}' has already been used"}
            percent_off = float(coupon.get("percent_off", 0))
        order_items: List[OrderItem] = []
        for product_id, quantity in wanted.items():
            product = self.products[product_id]
            order_items.append({"product_id": product_id, "quantity": quantity, "unit_price": float(product.get("price", 0))})
            product["stock"] = product.get("stock", 0) - quantity
        subtotal = round(sum(i["unit_price"] * i["quantity"] for i in order_items), 2)
        discount = round(subtotal * percent_off / 100, 2)
        order_id = self._next_id("O", self.orders)
        order: OrderInfo = {
            "order_id": order_id,
            "customer_id": customer_id,
            "items": order_items,
            "subtotal": subtotal,
            "discount": discount,
            "total": round(subtotal - discount, 2),
            "coupon_code": coupon_code,
            "status": "pending",
            "paid_amount": 0.0,
            "refunded_amount": 0.0,
            "carrier": None,
            "tracking_number": None,
            "cancel_reason": None,
        }
        self.orders[order_id] = order
        if coupon_code is not None:
            self._used_coupon_set().add(coupon_code)
        return {"success": True, "data": dict(order)}

    def pay_order(self, order_id: str, amount: float) -> dict:
        """Record full payment of a pending order.

        Args:
            order_id: The order to pay.
            amount: The amount paid; must equal the order total.

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} if not pending or the amount is wrong.
        """
        order = self._lookup(self.orders, order_id)
        if order is None:
            return {"success": False, "error": f"Order '{order_id}' not found"}
        if order.get("status") != "pending":
            return {"success": False, "error": f"Order '{order_id}' is {order.get('status')}, only pending orders can be paid"}
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return {"success": False, "error": "Amount must be a number"}
        total = float(order.get("total", 0))
        if abs(float(amount) - total) > 0.005:
            return {"success": False, "error": f"Payment must equal the order total of {total:.2f}"}
        order["paid_amount"] = total
        order["status"] = "paid"
        return {"success": True, "message": f"Order '{order_id}' paid ({total:.2f})"}

    def cancel_order(self, order_id: str, reason: str) -> dict:
        """Cancel a pending or paid order and put its items back in stock.

        Cancelling does not refund a payment; issue a refund separately.

        Args:
            order_id: The order to cancel.
            reason: Why the order is cancelled.

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} if the order is shipped or already cancelled.
        """
        order = self._lookup(self.orders, order_id)
        if order is None:
            return {"success": False, "error": f"Order '{order_id}' not found"}
        if order.get("status") not in ("pending", "paid"):
            return {"success": False, "error": f"Order '{order_id}' is {order.get('status')} and cannot be cancelled"}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A cancellation reason is required"}
        self._restock(order)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason.strip()
        return {"success": True, "message": f"Order '{order_id}' cancelled; items restocked"}

    def ship_order(
        self,
        order_id: str,
        carrier: Literal["UPS", "FedEx", "USPS", "DHL"],
        tracking_number: str,
    ) -> dict:
        """Mark a paid order as shipped.

        Args:
            order_id: The order to ship.
            carrier: The shipping carrier.
            tracking_number: The carrier's tracking number.

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} if the order is not paid or the input is invalid.
        """
        order = self._lookup(self.orders, order_id)
        if order is None:
            return {"success": False, "error": f"Order '{order_id}' not found"}
        if order.get("status") != "paid":
            return {"success": False, "error": f"Order '{order_id}' is {order.get('status')}, only paid orders can ship"}
        if carrier not in ("UPS", "FedEx", "USPS", "DHL"):
            return {"success": False, "error": f"Unknown carrier '{carrier}'"}
        if not isinstance(tracking_number, str) or not tracking_number.strip():
            return {"success": False, "error": "A tracking number is required"}
        order["status"] = "shipped"
        order["carrier"] = carrier
        order["tracking_number"] = tracking_number.strip()
        return {"success": True, "message": f"Order '{order_id}' shipped with {carrier}"}

    def issue_refund(self, order_id: str, amount: float, reason: str) -> dict:
        """Refund money on a paid order, or on an order cancelled after payment.

        Refunds on one order may not add up to more than was paid.

        Args:
            order_id: The order to refund.
            amount: The amount to refund (positive, at most the unrefunded paid amount).
            reason: Why the refund is given.

        Returns:
            dict: {"success": True, "data": RefundInfo} or {"success": False, "error": str}.
        """
        order = self._lookup(self.orders, order_id)
        if order is None:
            return {"success": False, "error": f"Order '{order_id}' not found"}
        paid = float(order.get("paid_amount", 0))
        status = order.get("status")
        if not (status == "paid" or (status == "cancelled" and paid > 0)):
            return {"success": False, "error": f"Order '{order_id}' is {status}; only paid orders or orders cancelled after payment can be refunded"}
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
            return {"success": False, "error": "Refund amount must be a positive number"}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A refund reason is required"}
        amount = round(float(amount), 2)
        remaining = round(paid - float(order.get("refunded_amount", 0)), 2)
        if amount > remaining + 1e-9:
            return {"success": False, "error": f"Refund exceeds the refundable amount of {remaining:.2f}"}
        refund_id = self._next_id("R", self.refunds)
        refund: RefundInfo = {"refund_id": refund_id, "order_id": order_id, "amount": amount, "reason": reason.strip()}
        self.refunds[refund_id] = refund
        order["refunded_amount"] = round(float(order.get("refunded_amount", 0)) + amount, 2)
        return {"success": True, "data": dict(refund)}
