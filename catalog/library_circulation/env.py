from datetime import date, timedelta
from typing import Any, Dict, List, Literal, Optional, TypedDict


class BookInfo(TypedDict):
    book_id: str
    title: str
    author: str
    total_copies: int
    available_copies: int


class MemberInfo(TypedDict):
    member_id: str
    name: str
    status: Literal["active", "suspended"]
    max_loans: int
    suspension_reason: Optional[str]


class LoanInfo(TypedDict):
    loan_id: str
    book_id: str
    member_id: str
    checkout_date: str
    due_date: str
    returned: bool
    returned_date: Optional[str]
    renewals: int


class LibraryCirculationSystem:
    """Circulation desk of a public library: books, members, loans and hold queues."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Books: {book_id: BookInfo}
        self.books: Dict[str, BookInfo] = {}
        # Members: {member_id: MemberInfo}
        self.members: Dict[str, MemberInfo] = {}
        # Loans: {loan_id: LoanInfo}
        self.loans: Dict[str, LoanInfo] = {}
        # Hold queues: {book_id: [member_id, ...]}, first in line first
        self.holds: Dict[str, List[str]] = {}
        # Today's date at the desk (ISO format)
        self.current_date: str = "2024-05-01"
        # Loan length and renewal extension, in days
        self.loan_period_days: int = 14
        # How many times one loan may be renewed
        self.max_renewals: int = 2

    # ------------------------------------------------------------------ helpers

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _today(self) -> date:
        return date.fromisoformat(self.current_date)

    def _open_loans_of(self, member_id: str) -> List[LoanInfo]:
        return [
            loan for loan in self.loans.values()
            if loan.get("member_id") == member_id and not loan.get("returned")
        ]

    def _next_loan_id(self) -> str:
        n = len(self.loans) + 1
        while f"L{n:04d}" in self.loans:
            n += 1
        return f"L{n:04d}"

    # ------------------------------------------------------------------ queries

    def get_member(self, member_id: str) -> dict:
        """Look up a library member by id.

        Args:
            member_id: The member's card id, e.g. "M001".

        Returns:
            dict: {"success": True, "data": MemberInfo plus "open_loans" (count)} or
            {"success": False, "error": str} when the member does not exist.
        """
        member = self._lookup(self.members, member_id)
        if member is None:
            return {"success": False, "error": f"Member '{member_id}' not found"}
        data = dict(member)
        data["open_loans"] = len(self._open_loans_of(member_id))
        return {"success": True, "data": data}

    def get_book(self, book_id: str) -> dict:
        """Get a book's catalog record, availability and hold queue.

        Args:
            book_id: The book's id, e.g. "B001".

        Returns:
            dict: {"success": True, "data": BookInfo plus "hold_queue" (list of member ids)} or
            {"success": False, "error": str} when the book does not exist.
        """
        book = self._lookup(self.books, book_id)
        if book is None:
            return {"success": False, "error": f"Book '{book_id}' not found"}
        data = dict(book)
        data["hold_queue"] = list(self.holds.get(book_id, []))
        return {"success": True, "data": data}

    def search_books_by_title(self, query: str, available_only: bool = False) -> dict:
        """Find books whose title contains the query (case-insensitive).

        Args:
            query: Part of the title to search for.
            available_only: If True, only return books with at least one available copy.

        Returns:
            dict: {"success": True, "data": List[BookInfo]} (possibly empty) or
            {"success": False, "error": str} when the query is empty.
        """
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "error": "Query must be a non-empty string"}
        needle = query.strip().lower()
        results = [
            dict(book) for book in self.books.values()
            if needle in str(book.get("title", "")).lower()
            and (not available_only or book.get("available_copies", 0) > 0)
        ]
        return {"success": True, "data": results}

    def list_member_loans(self, member_id: str, include_returned: bool = False) -> dict:
        """List a member's loans, with the book title for each.

        Args:
            member_id: The member's card id.
            include_returned: If True, also list loans that were already returned.

        Returns:
            dict: {"success": True, "data": List[LoanInfo plus "title"]} or
            {"success": False, "error": str} when the member does not exist.
        """
        if self._lookup(self.members, member_id) is None:
            return {"success": False, "error": f"Member '{member_id}' not found"}
        results = []
        for loan in self.loans.values():
            if loan.get("member_id") != member_id:
                continue
            if loan.get("returned") and not include_returned:
                continue
            entry = dict(loan)
            entry["title"] = self.books.get(loan.get("book_id", ""), {}).get("title")
            results.append(entry)
        return {"success": True, "data": results}

    # ------------------------------------------------------------ state changes

    def checkout_book(self, member_id: str, book_id: str) -> dict:
        """Lend one copy of a book to a member.

        The member must be active and below their loan limit, a copy must be
        available, and copies are reserved for members in the book's hold queue
        in order. A member at the head of the queue leaves it when they borrow.

        Args:
            member_id: The borrowing member's card id.
            book_id: The book to lend.

        Returns:
            dict: {"success": True, "data": LoanInfo} with the new loan, or
            {"success": False, "error": str} explaining which rule blocked it.
        """
        member = self._lookup(self.members, member_id)
        if member is None:
            return {"success": False, "error": f"Member '{member_id}' not found"}
        book = self._lookup(self.books, book_id)
        if book is None:
            return {"success": False, "error": f"Book '{book_id}' not found"}
        if member.get("status") != "active":
            return {"success": False, "error": f"Member '{member_id}' is suspended and cannot borrow"}
        open_loans = self._open_loans_of(member_id)
        if len(open_loans) >= member.get("max_loans", 0):
            return {"success": False, "error": f"Member '{member_id}' already has the maximum of {member.get('max_loans', 0)} open loans"}
        if any(loan.get("book_id") == book_id for loan in open_loans):
            return {"success": False, "error": f"Member '{member_id}' already has '{book_id}' on loan"}
        available = book.get("available_copies", 0)
        if available <= 0:
            return {"success": False, "error": f"No copies of '{book_id}' are available; place a hold instead"}
        queue = self.holds.get(book_id, [])
        if member_id in queue:
            position = queue.index(member_id)
            if position >= available:
                return {"success": False, "error": f"Available copies of '{book_id}' are reserved for members ahead in the hold queue"}
        elif len(queue) >= available:
            return {"success": False, "error": f"All available copies of '{book_id}' are reserved for members in the hold queue"}
        try:
            due = self._today() + timedelta(days=self.loan_period_days)
        except (TypeError, ValueError):
            return {"success": False, "error": "The desk date is invalid"}
        loan_id = self._next_loan_id()
        loan: LoanInfo = {
            "loan_id": loan_id,
            "book_id": book_id,
            "member_id": member_id,
            "checkout_date": self.current_date,
            "due_date": due.isoformat(),
            "returned": False,
            "returned_date": None,
            "renewals": 0,
        }
        self.loans[loan_id] = loan
        book["available_copies"] = available - 1
        if member_id in queue:
            queue.remove(member_id)
            if not queue:
                self.holds.pop(book_id, None)
        return {"success": True, "data": dict(loan)}

    def return_book(self, loan_id: str) -> dict:
        """Check in a borrowed copy, making it available again.

        Args:
            loan_id: The loan being returned, e.g. "L0003".

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} if the loan is unknown or already returned.
        """
        loan = self._lookup(self.loans, loan_id)
        if loan is None:
            return {"success": False, "error": f"Loan '{loan_id}' not found"}
        if loan.get("returned"):
            return {"success": False, "error": f"Loan '{loan_id}' was already returned"}
        book = self.books.get(loan.get("book_id", ""))
        loan["returned"] = True
        loan["returned_date"] = self.current_date
        if book is not None:
            book["available_copies"] = min(
                book.get("available_copies", 0) + 1, book.get("total_copies", 0)
            )
        return {"success": True, "message": f"Loan '{loan_id}' returned"}

    def renew_loan(self, loan_id: str) -> dict:
        """Extend an open loan's due date by one loan period.

        Renewal is refused for suspended members, overdue loans, loans that
        reached the renewal limit, and books other members are waiting for.

        Args:
            loan_id: The loan to renew.

        Returns:
            dict: {"success": True, "data": {"loan_id", "due_date", "renewals"}} or
            {"success": False, "error": str}.
        """
        loan = self._lookup(self.loans, loan_id)
        if loan is None:
            return {"success": False, "error": f"Loan '{loan_id}' not found"}
        if loan.get("returned"):
            return {"success": False, "error": f"Loan '{loan_id}' was already returned"}
        member = self.members.get(loan.get("member_id", ""))
        if member is None or member.get("status") != "active":
            return {"success": False, "error": "Only active members can renew loans"}
        if loan.get("renewals", 0) >= self.max_renewals:
            return {"success": False, "error": f"Loan '{loan_id}' reached the limit of {self.max_renewals} renewals"}
        if self.holds.get(loan.get("book_id", "")):
            return {"success": False, "error": "Other members are waiting for this book; it cannot be renewed"}
        try:
            due = date.fromisoformat(loan.get("due_date", ""))
            today = self._today()
        except (TypeError, ValueError):
            return {"success": False, "error": "The loan's due date is invalid"}
        if due < today:
            return {"success": False, "error": f"Loan '{loan_id}' is overdue and must be returned"}
        loan["due_date"] = (due + timedelta(days=self.loan_period_days)).isoformat()
        loan["renewals"] = loan.get("renewals", 0) + 1
        return {"success": True, "data": {"loan_id": loan_id, "due_date": loan["due_date"], "renewals": loan["renewals"]}}

    def place_hold(self, member_id: str, book_id: str) -> dict:
        """Put an active member at the end of a book's hold queue.

        Holds are only taken when no copy is available, and not for a book the
        member already borrowed or is already queued for.

        Args:
            member_id: The member asking for the hold.
            book_id: The book to hold.

        Returns:
            dict: {"success": True, "data": {"book_id", "position"}} (1-based position) or
            {"success": False, "error": str}.
        """
        member = self._lookup(self.members, member_id)
        if member is None:
            return {"success": False, "error": f"Member '{member_id}' not found"}
        book = self._lookup(self.books, book_id)
        if book is None:
            return {"success": False, "error": f"Book '{book_id}' not found"}
        if member.get("status") != "active":
            return {"success": False, "error": f"Member '{member_id}' is suspended and cannot place holds"}
        queue = self.holds.get(book_id, [])
        if member_id in queue:
            return {"success": False, "error": f"Member '{member_id}' is already in the hold queue for '{book_id}'"}
        if any(loan.get("book_id") == book_id for loan in self._open_loans_of(member_id)):
            return {"success": False, "error": f"Member '{member_id}' already has '{book_id}' on loan"}
        if book.get("available_copies", 0) > len(queue):
            return {"success": False, "error": f"A copy of '{book_id}' is available; check it out instead"}
        self.holds[book_id] = queue + [member_id]
        return {"success": True, "data": {"book_id": book_id, "position": len(queue) + 1}}

    def cancel_hold(self, member_id: str, book_id: str) -> dict:
        """Remove a member from a book's hold queue.

        Args:
            member_id: The member whose hold is cancelled.
            book_id: The book the hold was for.

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} when there is no such hold.
        """
        queue = self._lookup(self.holds, book_id) or []
        if member_id not in queue:
            return {"success": False, "error": f"Member '{member_id}' has no hold on '{book_id}'"}
        remaining = [m for m in queue if m != member_id]
        if remaining:
            self.holds[book_id] = remaining
        else:
            self.holds.pop(book_id, None)
        return {"success": True, "message": f"Hold of '{member_id}' on '{book_id}' cancelled"}

    def suspend_member(self, member_id: str, reason: str) -> dict:
        """Suspend a member's borrowing privileges and drop all their holds.

        Open loans stay open so the books can still be returned.

        Args:
            member_id: The member to suspend.
            reason: Why the account is suspended (recorded on the member).

        Returns:
            dict: {"success": True, "message": str} or
            {"success": False, "error": str} if unknown, already suspended, or no reason given.
        """
        member = self._lookup(self.members, member_id)
        if member is None:
            return {"success": False, "error": f"Member '{member_id}' not found"}
        if member.get("status") == "suspended":
            return {"success": False, "error": f"Member '{member_id}' is already suspended"}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A suspension reason is required"}
        member["status"] = "suspended"
        member["suspension_reason"] = reason.strip()
        for book_id in list(self.holds):
            remaining = [m for m in self.holds[book_id] if m != member_id]
            if remaining:
                self.holds[book_id] = remaining
            else:
                del self.holds[book_id]
        return {"success": True, "message": f"Member '{member_id}' suspended"}
