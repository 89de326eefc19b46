"""What the scripted agent (and, in conversation mode, the simulated user) says, per scenario."""

from __future__ import annotations

from typing import Any

Turn = dict[str, Any]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


LIB_001: list[list[Turn]] = [
    [  # looks first, then the three changes in one turn (parallel calls), then answers: reward 1.0
        {"tool_calls": [call("list_member_loans", member_id="M002")]},
        {"content": "Priya has Kindred on loan L0003 and Dune on L0001.",
         "tool_calls": [call("return_book", loan_id="L0003"), call("checkout_book", member_id="M002", book_id="B003"),
                        call("renew_loan", loan_id="L0001")]},
        {"content": "Done: Kindred is returned, Parable of the Sower is checked out to you, and Dune is renewed."},
    ],
    [  # returns the book and stops there: one check of three, reward 1/3
        {"tool_calls": [call("return_book", loan_id="L0003")]},
        {"content": "Kindred is returned."},
    ],
]

STORE_001: list[list[Turn]] = [
    [  # solves it: reward 1.0
        {"tool_calls": [call("place_order", customer_id="C001", coupon_code="SPRING10",
                             items=[{"product_id": "P001", "quantity": 2}, {"product_id": "P002", "quantity": 1}])]},
        {"tool_calls": [call("pay_order", order_id="O0006", amount=80.53)]},
        {"content": "Order O0006 is placed with SPRING10 and paid in full (80.53)."},
    ],
    [  # writes a broken call first, is told so, then solves it: reward 1.0 but not clean training data
        {"raw": '<tool_call>{"name": "place_order", "arguments": {</tool_call>'},
        {"tool_calls": [call("place_order", customer_id="C001", coupon_code="SPRING10",
                             items=[{"product_id": "P001", "quantity": 2}, {"product_id": "P002", "quantity": 1}])]},
        {"tool_calls": [call("pay_order", order_id="O0006", amount=80.53)]},
        {"content": "Order O0006 is placed and paid."},
    ],
]

# Conversation mode, lib-001: the user reveals the task in two parts and stops once it is done.
LIB_001_USER = [
    "Hi, I'm Priya Natarajan, card M002. I'd like to return my copy of Kindred.",
    "Thanks. Could you also renew my Dune loan and lend me Parable of the Sower?",
    "That's everything, thank you!\n###STOP###",
]
LIB_001_OPENING = LIB_001_USER[0]

LIB_001_CONVERSATION: list[list[Turn]] = [
    [  # does each part as it is revealed: reward 1.0
        {"tool_calls": [call("list_member_loans", member_id="M002")]},
        {"tool_calls": [call("return_book", loan_id="L0003")]},
        {"content": "Kindred is returned. Is there anything else?"},
        {"tool_calls": [call("renew_loan", loan_id="L0001"), call("checkout_book", member_id="M002", book_id="B003")]},
        {"content": "Dune is renewed and Parable of the Sower is yours until 2024-05-15."},
    ],
    [  # returns the book, then declines the rest: the user gives up; reward 1/3
        {"tool_calls": [call("return_book", loan_id="L0003")]},
        {"content": "Kindred is returned."},
        {"content": "I'm sorry, I cannot do that today."},
    ],
]


LIB_003_AS_TEXT: list[list[Turn]] = [
    [  # calls written in the text, in both forms verifiers' parsers read, with a broken block last
        {"raw": 'Let me look first.\n<tool_call>\n{"name": "list_member_loans", "arguments": {"member_id": "M001"}}\n'
                "</tool_call>"},
        {"raw": '<tool_call>\n{"name": "return_book", "arguments": {"loan_id": "L0004"}}\n</tool_call>\n'
                "<tool_call>\n<function=checkout_book>\n<parameter=member_id>\nM004\n</parameter>\n"
                "<parameter=book_id>\nB004\n</parameter>\n</function>\n</tool_call>\n"
                '<tool_call>{"name": "checkout_book", "arguments": "{\\"member_id\\": \\"M001\\", '
                '\\"book_id\\": \\"B005\\"}"}</tool_call>'},
        {"raw": '<tool_call>{"name": "get_book", "arguments": {</tool_call>'},
        {"content": "Circe is back and lent to Jun; Alice has her new book."},
    ],
]
