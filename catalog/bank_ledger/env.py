from typing import Any, Dict, Literal, Optional, Tuple, TypedDict


class CustomerInfo(TypedDict):
    customer_id: str
    name: str
    email: str
    identity_verified: bool


class AccountInfo(TypedDict):
    account_id: str
    customer_id: str
    account_type: Literal["checking", "savings"]
    nickname: str
    balance: float
    status: Literal["active", "frozen", "closed"]
    daily_debit_limit: float
    freeze_reason: Optional[str]


Kind = Literal["deposit", "withdrawal", "transfer_in", "transfer_out", "reversal"]


class TransactionInfo(TypedDict):
    txn_id: str
    account_id: str
    kind: Kind
    amount: float
    balance_after: float
    date: str
    memo: str
    counterparty_account_id: Optional[str]
    linked_txn_id: Optional[str]
    reversed: bool


DEBITS = ("withdrawal", "transfer_out")


class BankLedgerSystem:
    """Teller system of a retail bank: customers, accounts, a ledger of transactions, freezes and limits."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Customers: {customer_id: CustomerInfo}
        self.customers: Dict[str, CustomerInfo] = {}
        # Accounts: {account_id: AccountInfo}; balances are in dollars with two decimals
        self.accounts: Dict[str, AccountInfo] = {}
        # Ledger: {txn_id: TransactionInfo}; entries are never deleted, mistakes are reversed
        self.transactions: Dict[str, TransactionInfo] = {}
        # Today's business date (ISO format)
        self.current_date: str = "2024-09-16"
        # Withdrawals and outgoing transfers a savings account may make per calendar month
        self.savings_monthly_debits: int = 6

    # ------------------------------------------------------------------ helpers

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _amount_problem(self, amount: Any) -> Optional[str]:
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            return "Amount must be a number"
        if amount <= 0:
            return "Amount must be positive"
        if abs(round(amount, 2) - amount) > 1e-9:
            return "Amount cannot have more than two decimals"
        return None

    def _debited_today(self, account_id: str) -> float:
        return round(sum(
            float(t.get("amount", 0)) for t in self.transactions.values()
            if t.get("account_id") == account_id and t.get("kind") in DEBITS
            and t.get("date") == self.current_date and not t.get("reversed")
        ), 2)

    def _debits_this_month(self, account_id: str) -> int:
        month = self.current_date[:7]
        return sum(
            1 for t in self.transactions.values()
            if t.get("account_id") == account_id and t.get("kind") in DEBITS
            and str(t.get("date", "")).startswith(month) and not t.get("reversed")
        )

    def _debit_problem(self, account: AccountInfo, amount: float) -> Optional[str]:
        """Why this account cannot pay out the amount today, or None when it can."""
        account_id = account.get("account_id", "")
        if account.get("status") != "active":
            return f"Account '{account_id}' is {account.get('status')}; no money can leave it"
        balance = float(account.get("balance", 0))
        if amount > balance + 1e-9:
            return f"Insufficient funds: balance is {balance:.2f}, {amount:.2f} requested"
        limit = float(account.get("daily_debit_limit", 0))
        used = self._debited_today(account_id)
        if used + amount > limit + 1e-9:
            return f"Daily limit of {limit:.2f} exceeded: {used:.2f} already paid out today"
        if account.get("account_type") == "savings" and self._debits_this_month(account_id) >= self.savings_monthly_debits:
            return f"Savings account '{account_id}' already made {self.savings_monthly_debits} withdrawals or transfers this month"
        return None

    def _post(
        self, account: AccountInfo, kind: Kind, amount: float, memo: str,
        counterparty: Optional[str] = None, linked: Optional[str] = None,
    ) -> TransactionInfo:
        signed = -amount if kind in DEBITS or (kind == "reversal" and linked and self._is_credit(linked)) else amount
        account["balance"] = round(float(account.get("balance", 0)) + signed, 2)
        n = len(self.transactions) + 1
        while f"T{n:05d}" in self.transactions:
            n += 1
        txn: TransactionInfo = {
            "txn_id": f"T{n:05d}",
            "account_id": account.get("account_id", ""),
            "kind": kind,
            "amount": amount,
            "balance_after": account["balance"],
            "date": self.current_date,
            "memo": memo,
            "counterparty_account_id": counterparty,
            "linked_txn_id": linked,
            "reversed": False,
        }
        self.transactions[txn["txn_id"]] = txn
        return txn

    def _active_account(self, account_id: Any, action: str) -> Tuple[Optional[AccountInfo], str]:
        """The account if it exists and is active, else None and why it cannot be ``action``."""
        account = self._lookup(self.accounts, account_id)
        if account is None:
            return None, f"Account '{account_id}' not found"
        if account.get("status") != "active":
            return None, f"Account '{account_id}' is {account.get('status')}, only active accounts can be {action}"
        return account, ""

    def _is_credit(self, txn_id: str) -> bool:
        return (self.transactions.get(txn_id) or {}).get("kind") in ("deposit", "transfer_in")

    # ------------------------------------------------------------------ queries

    def find_customer(self, name: str) -> dict:
        """Find customers whose name contains the given text (case-insensitive).

        Args:
            name: Part of the customer's name.

        Returns:
            dict: {"success": True, "data": List[CustomerInfo]} (possibly empty) or
            {"success": False, "error": str} when the name is empty.
        """
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "Name must be a non-empty string"}
        needle = name.strip().lower()
        return {"success": True, "data": [dict(c) for c in self.customers.values() if needle in str(c.get("name", "")).lower()]}

    def list_customer_accounts(self, customer_id: str) -> dict:
        """List every account a customer holds, closed ones included.

        Args:
            customer_id: The customer's id, e.g. "C001".

        Returns:
            dict: {"success": True, "data": List[AccountInfo]} or
            {"success": False, "error": str} when the customer does not exist.
        """
        if self._lookup(self.customers, customer_id) is None:
            return {"success": False, "error": f"Customer '{customer_id}' not found"}
        return {"success": True, "data": [dict(a) for a in self.accounts.values() if a.get("customer_id") == customer_id]}

    def get_account(self, account_id: str) -> dict:
        """Get an account with what it has paid out today and this month.

        Args:
            account_id: The account number, e.g. "ACC-1001".

        Returns:
            dict: {"success": True, "data": AccountInfo plus "debited_today" (float) and
            "debits_this_month" (int)} or {"success": False, "error": str}.
        """
        account = self._lookup(self.accounts, account_id)
        if account is None:
            return {"success": False, "error": f"Account '{account_id}' not found"}
        data = dict(account)
        data["debited_today"] = self._debited_today(account_id)
        data["debits_this_month"] = self._debits_this_month(account_id)
        return {"success": True, "data": data}

    def list_transactions(self, account_id: str, limit: int = 20) -> dict:
        """List an account's most recent ledger entries, newest first.

        Args:
            account_id: The account number.
            limit: How many entries to return (1-100).

        Returns:
            dict: {"success": True, "data": List[TransactionInfo]} or {"success": False, "error": str}.
        """
        if self._lookup(self.accounts, account_id) is None:
            return {"success": False, "error": f"Account '{account_id}' not found"}
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            return {"success": False, "error": "Limit must be an integer from 1 to 100"}
        entries = [dict(t) for t in self.transactions.values() if t.get("account_id") == account_id]
        entries.sort(key=lambda t: (str(t.get("date")), str(t.get("txn_id"))), reverse=True)
        return {"success": True, "data": entries[:limit]}

    # ------------------------------------------------------------ state changes

    def deposit(self, account_id: str, amount: float, memo: str) -> dict:
        """Pay money into an account.

        Active and frozen accounts accept deposits; closed accounts do not.

        Args:
            account_id: The account to credit.
            amount: The amount, positive with at most two decimals.
            memo: What the deposit is, e.g. "Cash deposit".

        Returns:
            dict: {"success": True, "data": TransactionInfo} or {"success": False, "error": str}.
        """
        account = self._lookup(self.accounts, account_id)
        if account is None:
            return {"success": False, "error": f"Account '{account_id}' not found"}
        if account.get("status") == "closed":
            return {"success": False, "error": f"Account '{account_id}' is closed"}
        problem = self._amount_problem(amount)
        if problem:
            return {"success": False, "error": problem}
        if not isinstance(memo, str) or not memo.strip():
            return {"success": False, "error": "A memo is required"}
        txn = self._post(account, "deposit", round(float(amount), 2), memo.strip())
        return {"success": True, "data": dict(txn)}

    def withdraw(self, account_id: str, amount: float, memo: str) -> dict:
        """Pay money out of an account.

        The account must be active, keep a balance of zero or more, stay within its
        daily debit limit and, for savings, within the monthly number of debits.

        Args:
            account_id: The account to debit.
            amount: The amount, positive with at most two decimals.
            memo: What the withdrawal is, e.g. "ATM cash".

        Returns:
            dict: {"success": True, "data": TransactionInfo} or {"success": False, "error": str}.
        """
        account = self._lookup(self.accounts, account_id)
        if account is None:
            return {"success": False, "error": f"Account '{account_id}' not found"}
        problem = self._amount_problem(amount)
        if problem:
            return {"success": False, "error": problem}
        if not isinstance(memo, str) or not memo.strip():
            return {"success": False, "error": "A memo is required"}
        amount = round(float(amount), 2)
        problem = self._debit_problem(account, amount)
        if problem:
            return {"success": False, "error": problem}
        txn = self._post(account, "withdrawal", amount, memo.strip())
        return {"success": True, "data": dict(txn)}

    def transfer(self, from_account_id: str, to_account_id: str, amount: float, memo: str) -> dict:
        """Move money from one account to another.

        The source follows the withdrawal rules; the destination must not be closed.
        Transfers to another customer's account need a sender whose identity is verified.

        Args:
            from_account_id: The account paying.
            to_account_id: The account receiving (a different account).
            amount: The amount, positive with at most two decimals.
            memo: What the transfer is for.

        Returns:
            dict: {"success": True, "data": {"debit": TransactionInfo, "credit": TransactionInfo}} or
            {"success": False, "error": str}.
        """
        source = self._lookup(self.accounts, from_account_id)
        if source is None:
            return {"success": False, "error": f"Account '{from_account_id}' not found"}
        target = self._lookup(self.accounts, to_account_id)
        if target is None:
            return {"success": False, "error": f"Account '{to_account_id}' not found"}
        if from_account_id == to_account_id:
            return {"success": False, "error": "Source and destination must be different accounts"}
        if target.get("status") == "closed":
            return {"success": False, "error": f"Account '{to_account_id}' is closed"}
        problem = self._amount_problem(amount)
        if problem:
            return {"success": False, "error": problem}
        if not isinstance(memo, str) or not memo.strip():
            return {"success": False, "error": "A memo is required"}
        if source.get("customer_id") != target.get("customer_id"):
            sender = self.customers.get(source.get("customer_id", "")) or {}
            if not sender.get("identity_verified"):
                return {"success": False, "error": "Transfers to another customer need a sender with a verified identity"}
        amount = round(float(amount), 2)
        problem = self._debit_problem(source, amount)
        if problem:
            return {"success": False, "error": problem}
        debit = self._post(source, "transfer_out", amount, memo.strip(), counterparty=to_account_id)
        credit = self._post(target, "transfer_in", amount, memo.strip(), counterparty=from_account_id,
                            linked=debit["txn_id"])
        debit["linked_txn_id"] = credit["txn_id"]
        return {"success": True, "data": {"debit": dict(debit), "credit": dict(credit)}}

    def reverse_transaction(self, txn_id: str, reason: str) -> dict:
        """Undo a deposit, withdrawal or transfer by posting opposite entries.

        A transfer is reversed on both accounts together (either of its two entries
        may be given). Undoing a credit needs an active account with enough money; an
        entry is reversed at most once and closed accounts cannot be touched. A reversed
        debit no longer counts against the daily limit or the monthly savings debits.

        Args:
            txn_id: The ledger entry to undo, e.g. "T00012".
            reason: Why it is reversed (becomes the memo).

        Returns:
            dict: {"success": True, "data": List[TransactionInfo]} with the new entries, or
            {"success": False, "error": str}.
        """
        txn = self._lookup(self.transactions, txn_id)
        if txn is None:
            return {"success": False, "error": f"Transaction '{txn_id}' not found"}
        if txn.get("kind") == "reversal":
            return {"success": False, "error": "A reversal cannot itself be reversed"}
        if txn.get("reversed"):
            return {"success": False, "error": f"Transaction '{txn_id}' was already reversed"}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A reason is required"}
        entries = [txn]
        if txn.get("kind") in ("transfer_in", "transfer_out"):
            other = self.transactions.get(txn.get("linked_txn_id") or "")
            if other is None:
                return {"success": False, "error": f"The other half of transfer '{txn_id}' is missing"}
            entries.append(other)
        for entry in entries:
            account = self.accounts.get(entry.get("account_id", ""))
            if account is None or account.get("status") == "closed":
                return {"success": False, "error": f"Account '{entry.get('account_id')}' is closed or missing"}
            if not self._is_credit(entry.get("txn_id", "")):
                continue
            # Undoing a credit takes money out of the account, so the debit rules on status and balance apply.
            if account.get("status") != "active":
                return {"success": False, "error": f"Account '{entry.get('account_id')}' is {account.get('status')}; no money can leave it"}
            if float(account.get("balance", 0)) < float(entry.get("amount", 0)) - 1e-9:
                return {"success": False, "error": f"Account '{entry.get('account_id')}' has too little money to reverse {entry.get('txn_id')}"}
        posted = []
        for entry in entries:
            account = self.accounts[entry.get("account_id", "")]
            posted.append(dict(self._post(account, "reversal", float(entry.get("amount", 0)), reason.strip(),
                                          counterparty=entry.get("counterparty_account_id"), linked=entry.get("txn_id"))))
            entry["reversed"] = True
        return {"success": True, "data": posted}

    def freeze_account(self, account_id: str, reason: str) -> dict:
        """Freeze an active account: no money can leave it until it is unfrozen.

        Args:
            account_id: The account to freeze.
            reason: Why it is frozen, e.g. "Card reported stolen".

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        account, problem = self._active_account(account_id, "frozen")
        if account is None:
            return {"success": False, "error": problem}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A reason is required"}
        account["status"] = "frozen"
        account["freeze_reason"] = reason.strip()
        return {"success": True, "message": f"Account '{account_id}' frozen"}

    def unfreeze_account(self, account_id: str) -> dict:
        """Make a frozen account active again.

        Args:
            account_id: The account to unfreeze.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        account = self._lookup(self.accounts, account_id)
        if account is None:
            return {"success": False, "error": f"Account '{account_id}' not found"}
        if account.get("status") != "frozen":
            return {"success": False, "error": f"Account '{account_id}' is not frozen"}
        account["status"] = "active"
        account["freeze_reason"] = None
        return {"success": True, "message": f"Account '{account_id}' is active again"}

    def open_account(
        self,
        customer_id: str,
        account_type: Literal["checking", "savings"],
        nickname: str,
        daily_debit_limit: float = 1000.0,
    ) -> dict:
        """Open a new, empty account for a customer whose identity is verified.

        A customer may hold at most one open (not closed) account with the same nickname.

        Args:
            customer_id: The customer opening the account.
            account_type: "checking" or "savings".
            nickname: A short name the customer knows the account by, e.g. "Holiday fund".
            daily_debit_limit: Most that may leave the account per day (positive, at most 10000).

        Returns:
            dict: {"success": True, "data": AccountInfo} or {"success": False, "error": str}.
        """
        customer = self._lookup(self.customers, customer_id)
        if customer is None:
            return {"success": False, "error": f"Customer '{customer_id}' not found"}
        if not customer.get("identity_verified"):
            return {"success": False, "error": f"Customer '{customer_id}' must verify their identity first"}
        if account_type not in ("checking", "savings"):
            return {"success": False, "error": "Account type must be 'checking' or 'savings'"}
        if not isinstance(nickname, str) or not nickname.strip():
            return {"success": False, "error": "A nickname is required"}
        if isinstance(daily_debit_limit, bool) or not isinstance(daily_debit_limit, (int, float)) or not 0 < daily_debit_limit <= 10000:
            return {"success": False, "error": "Daily debit limit must be above 0 and at most 10000"}
        for other in self.accounts.values():
            if (other.get("customer_id") == customer_id and other.get("status") != "closed"
                    and str(other.get("nickname", "")).lower() == nickname.strip().lower()):
                return {"success": False, "error": f"Customer already has an account called '{nickname.strip()}'"}
        n = 1001 + len(self.accounts)
        while f"ACC-{n}" in self.accounts:
            n += 1
        account: AccountInfo = {
            "account_id": f"ACC-{n}",
            "customer_id": customer_id,
            "account_type": account_type,
            "nickname": nickname.strip(),
            "balance": 0.0,
            "status": "active",
            "daily_debit_limit": round(float(daily_debit_limit), 2),
            "freeze_reason": None,
        }
        self.accounts[account["account_id"]] = account
        return {"success": True, "data": dict(account)}

    def close_account(self, account_id: str) -> dict:
        """Close an active account whose balance is exactly zero.

        Args:
            account_id: The account to close.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        account, problem = self._active_account(account_id, "closed")
        if account is None:
            return {"success": False, "error": problem}
        if abs(float(account.get("balance", 0))) > 0.005:
            return {"success": False, "error": f"Account '{account_id}' still holds {float(account.get('balance', 0)):.2f}; empty it first"}
        account["status"] = "closed"
        return {"success": True, "message": f"Account '{account_id}' closed"}
