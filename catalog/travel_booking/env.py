import calendar
import datetime as dt
from typing import Any, Dict, Literal, Optional, Tuple, TypedDict


class TravelerInfo(TypedDict):
    traveler_id: str
    name: str
    date_of_birth: str
    passport_number: Optional[str]
    passport_expiry: Optional[str]
    loyalty_tier: Literal["standard", "gold"]


class CabinInfo(TypedDict):
    price: float
    seats_left: int


class FlightInfo(TypedDict):
    flight_id: str
    flight_number: str
    origin: str
    origin_city: str
    destination: str
    destination_city: str
    departure: str
    arrival: str
    international: bool
    status: Literal["scheduled", "cancelled"]
    cabins: Dict[str, CabinInfo]


class HotelInfo(TypedDict):
    hotel_id: str
    name: str
    city: str
    nightly_rate: float
    rooms_total: int


class BookingInfo(TypedDict):
    booking_id: str
    traveler_id: str
    kind: Literal["flight", "hotel"]
    flight_id: Optional[str]
    cabin: Optional[Literal["economy", "business"]]
    hotel_id: Optional[str]
    check_in: Optional[str]
    check_out: Optional[str]
    price: float
    change_fees: float
    status: Literal["confirmed", "cancelled"]
    refund_amount: Optional[float]


CABINS = ("economy", "business")


class TravelBookingDesk:
    """A travel agency's booking desk: travelers, flights with cabins and seats, hotels, bookings and refunds."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Travelers: {traveler_id: TravelerInfo}
        self.travelers: Dict[str, TravelerInfo] = {}
        # Flights: {flight_id: FlightInfo}; times are local "YYYY-MM-DDTHH:MM", airports are IATA codes
        self.flights: Dict[str, FlightInfo] = {}
        # Hotels: {hotel_id: HotelInfo}
        self.hotels: Dict[str, HotelInfo] = {}
        # Bookings: {booking_id: BookingInfo}
        self.bookings: Dict[str, BookingInfo] = {}
        # Today's date at the desk (ISO format)
        self.current_date: str = "2024-07-01"
        # Fee for moving a flight booking to another flight (waived for gold travelers)
        self.change_fee: float = 50.0
        # Days before departure from which a cancelled flight is refunded in full
        self.full_refund_days: int = 7
        # Months a passport must stay valid after an international departure
        self.passport_validity_months: int = 6
        # Longest hotel stay, in nights
        self.max_nights: int = 14

    # ------------------------------------------------------------------ helpers

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _date(self, value: Any) -> Optional[dt.date]:
        if not isinstance(value, str):
            return None
        try:
            parsed = dt.date.fromisoformat(value)
        except ValueError:
            return None
        # Dates are compared as strings elsewhere, so only the canonical form is accepted.
        return parsed if parsed.isoformat() == value else None

    def _matches_place(self, code: str, city: str, wanted: str) -> bool:
        return wanted.strip().lower() in (code.lower(), city.lower())

    def _passport_problem(self, traveler: TravelerInfo, flight: FlightInfo) -> Optional[str]:
        if not flight.get("international"):
            return None
        expiry = self._date(traveler.get("passport_expiry"))
        if not traveler.get("passport_number") or expiry is None:
            return f"{traveler.get('name')} has no passport on file; an international flight needs one"
        departure = dt.date.fromisoformat(str(flight.get("departure", ""))[:10])
        months = departure.month - 1 + self.passport_validity_months
        year, month = departure.year + months // 12, months % 12 + 1
        needed = dt.date(year, month, min(departure.day, calendar.monthrange(year, month)[1]))
        if expiry < needed:
            return (f"{traveler.get('name')}'s passport expires {traveler.get('passport_expiry')}; it must be valid "
                    f"{self.passport_validity_months} months after departure")
        return None

    def _overlapping_flight(self, traveler_id: str, flight: FlightInfo, skip: Optional[str] = None) -> Optional[str]:
        for booking in self.bookings.values():
            if (booking.get("traveler_id") != traveler_id or booking.get("kind") != "flight"
                    or booking.get("status") != "confirmed" or booking.get("booking_id") == skip):
                continue
            other = self.flights.get(booking.get("flight_id") or "")
            if other is None:
                continue
            if other.get("flight_id") == flight.get("flight_id"):
                return f"Already booked on {flight.get('flight_number')} ({booking.get('booking_id')})"
            if str(flight.get("departure")) < str(other.get("arrival")) and str(other.get("departure")) < str(flight.get("arrival")):
                return f"Overlaps flight {other.get('flight_number')} in booking {booking.get('booking_id')}"
        return None

    def _flight_problem(self, traveler: TravelerInfo, flight: FlightInfo, cabin: Any, skip: Optional[str] = None) -> Optional[str]:
        """Why this traveler cannot take this flight in this cabin, or None when they can."""
        if flight.get("status") != "scheduled":
            return f"Flight {flight.get('flight_number')} is cancelled by the airline"
        if str(flight.get("departure", ""))[:10] <= self.current_date:
            return f"Flight {flight.get('flight_number')} departs too soon to book (bookings close the day before)"
        if cabin not in CABINS:
            return "Cabin must be 'economy' or 'business'"
        seats = flight.get("cabins", {}).get(cabin)
        if seats is None or int(seats.get("seats_left", 0)) <= 0:
            return f"No {cabin} seats left on {flight.get('flight_number')}"
        return self._passport_problem(traveler, flight) or self._overlapping_flight(
            traveler.get("traveler_id", ""), flight, skip)

    def _rooms_free(self, hotel_id: str, check_in: str, check_out: str) -> int:
        taken = sum(
            1 for b in self.bookings.values()
            if b.get("kind") == "hotel" and b.get("hotel_id") == hotel_id and b.get("status") == "confirmed"
            and str(b.get("check_in")) < check_out and check_in < str(b.get("check_out"))
        )
        return int((self.hotels.get(hotel_id) or {}).get("rooms_total", 0)) - taken

    def _stay_problem(self, check_in: Any, check_out: Any) -> Tuple[int, Optional[str]]:
        start, end = self._date(check_in), self._date(check_out)
        if start is None or end is None:
            return 0, "Dates must be ISO dates (YYYY-MM-DD)"
        if check_in < self.current_date:
            return 0, f"Check-in {check_in} is in the past"
        nights = (end - start).days
        if not 1 <= nights <= self.max_nights:
            return nights, f"A stay is 1 to {self.max_nights} nights ({nights} given)"
        return nights, None

    def _next_booking_id(self) -> str:
        n = len(self.bookings) + 1
        while f"B{n:04d}" in self.bookings:
            n += 1
        return f"B{n:04d}"

    def _booking(self, traveler_id: str, kind: Literal["flight", "hotel"], price: float, **details: Any) -> BookingInfo:
        booking: BookingInfo = {
            "booking_id": self._next_booking_id(),
            "traveler_id": traveler_id,
            "kind": kind,
            "flight_id": details.get("flight_id"),
            "cabin": details.get("cabin"),
            "hotel_id": details.get("hotel_id"),
            "check_in": details.get("check_in"),
            "check_out": details.get("check_out"),
            "price": round(price, 2),
            "change_fees": 0.0,
            "status": "confirmed",
            "refund_amount": None,
        }
        self.bookings[booking["booking_id"]] = booking
        return booking

    # ------------------------------------------------------------------ queries

    def find_traveler(self, name: str) -> dict:
        """Find travelers whose name contains the given text (case-insensitive).

        Args:
            name: Part of the traveler's name.

        Returns:
            dict: {"success": True, "data": List[TravelerInfo]} (possibly empty) or
            {"success": False, "error": str} when the name is empty.
        """
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "Name must be a non-empty string"}
        needle = name.strip().lower()
        return {"success": True, "data": [dict(t) for t in self.travelers.values() if needle in str(t.get("name", "")).lower()]}

    def search_flights(self, origin: str, destination: str, date: str) -> dict:
        """Find scheduled flights between two places on a departure date, earliest first.

        Args:
            origin: Departure airport code (e.g. "BER") or city name (e.g. "Berlin").
            destination: Arrival airport code or city name.
            date: Departure date, "YYYY-MM-DD".

        Returns:
            dict: {"success": True, "data": List[FlightInfo]} (possibly empty) or {"success": False, "error": str}.
        """
        if not all(isinstance(v, str) and v.strip() for v in (origin, destination)):
            return {"success": False, "error": "Origin and destination are required"}
        if self._date(date) is None:
            return {"success": False, "error": f"Date '{date}' is not an ISO date (YYYY-MM-DD)"}
        found = [
            dict(f) for f in self.flights.values()
            if f.get("status") == "scheduled" and str(f.get("departure", "")).startswith(date)
            and self._matches_place(f.get("origin", ""), f.get("origin_city", ""), origin)
            and self._matches_place(f.get("destination", ""), f.get("destination_city", ""), destination)
        ]
        found.sort(key=lambda f: str(f.get("departure")))
        return {"success": True, "data": found}

    def search_hotels(self, city: str, check_in: str, check_out: str) -> dict:
        """List a city's hotels with free rooms for a stay and the stay's total price, cheapest first.

        Args:
            city: The city, e.g. "Lisbon".
            check_in: Arrival date, "YYYY-MM-DD".
            check_out: Departure date, "YYYY-MM-DD" (after check_in).

        Returns:
            dict: {"success": True, "data": List[HotelInfo plus "rooms_free" and "total_price"]} or
            {"success": False, "error": str}.
        """
        if not isinstance(city, str) or not city.strip():
            return {"success": False, "error": "A city is required"}
        nights, problem = self._stay_problem(check_in, check_out)
        if problem:
            return {"success": False, "error": problem}
        results = []
        for hotel in self.hotels.values():
            if str(hotel.get("city", "")).lower() != city.strip().lower():
                continue
            entry = dict(hotel)
            entry["rooms_free"] = self._rooms_free(hotel.get("hotel_id", ""), check_in, check_out)
            entry["total_price"] = round(float(hotel.get("nightly_rate", 0)) * nights, 2)
            results.append(entry)
        results.sort(key=lambda h: float(h.get("total_price", 0)))
        return {"success": True, "data": results}

    def list_traveler_bookings(self, traveler_id: str, include_cancelled: bool = False) -> dict:
        """List a traveler's bookings with the flight or hotel they are for.

        Args:
            traveler_id: The traveler's id, e.g. "T001".
            include_cancelled: If True, also list cancelled bookings.

        Returns:
            dict: {"success": True, "data": List[BookingInfo plus "flight" or "hotel"]} or
            {"success": False, "error": str}.
        """
        if self._lookup(self.travelers, traveler_id) is None:
            return {"success": False, "error": f"Traveler '{traveler_id}' not found"}
        results = []
        for booking in self.bookings.values():
            if booking.get("traveler_id") != traveler_id:
                continue
            if booking.get("status") == "cancelled" and not include_cancelled:
                continue
            entry: Dict[str, Any] = dict(booking)
            if booking.get("kind") == "flight":
                entry["flight"] = dict(self.flights.get(booking.get("flight_id") or "") or {})
            else:
                entry["hotel"] = dict(self.hotels.get(booking.get("hotel_id") or "") or {})
            results.append(entry)
        return {"success": True, "data": results}

    # ------------------------------------------------------------ state changes

    def update_passport(self, traveler_id: str, passport_number: str, passport_expiry: str) -> dict:
        """Record a traveler's current passport.

        Args:
            traveler_id: The traveler.
            passport_number: The passport number (6-12 letters and digits).
            passport_expiry: Expiry date, "YYYY-MM-DD", after today.

        Returns:
            dict: {"success": True, "data": TravelerInfo} or {"success": False, "error": str}.
        """
        traveler = self._lookup(self.travelers, traveler_id)
        if traveler is None:
            return {"success": False, "error": f"Traveler '{traveler_id}' not found"}
        if not isinstance(passport_number, str) or not passport_number.isalnum() or not 6 <= len(passport_number) <= 12:
            return {"success": False, "error": "A passport number is 6-12 letters and digits"}
        if self._date(passport_expiry) is None or passport_expiry <= self.current_date:
            return {"success": False, "error": f"Expiry '{passport_expiry}' must be an ISO date after today"}
        traveler["passport_number"] = passport_number.upper()
        traveler["passport_expiry"] = passport_expiry
        return {"success": True, "data": dict(traveler)}

    def book_flight(self, traveler_id: str, flight_id: str, cabin: Literal["economy", "business"] = "economy") -> dict:
        """Book a seat on a flight for a traveler, taking one seat of the cabin.

        The flight must be scheduled and depart after today, the cabin must have a seat,
        international flights need a passport valid 6 months after departure, and the
        traveler may not hold another flight that overlaps it.

        Args:
            traveler_id: The traveler.
            flight_id: The flight, e.g. "F0003".
            cabin: "economy" or "business".

        Returns:
            dict: {"success": True, "data": BookingInfo} or {"success": False, "error": str}.
        """
        traveler = self._lookup(self.travelers, traveler_id)
        if traveler is None:
            return {"success": False, "error": f"Traveler '{traveler_id}' not found"}
        flight = self._lookup(self.flights, flight_id)
        if flight is None:
            return {"success": False, "error": f"Flight '{flight_id}' not found"}
        problem = self._flight_problem(traveler, flight, cabin)
        if problem:
            return {"success": False, "error": problem}
        seats = flight["cabins"][cabin]
        seats["seats_left"] = int(seats.get("seats_left", 0)) - 1
        booking = self._booking(traveler_id, "flight", float(seats.get("price", 0)), flight_id=flight_id, cabin=cabin)
        return {"success": True, "data": dict(booking)}

    def book_hotel(self, traveler_id: str, hotel_id: str, check_in: str, check_out: str) -> dict:
        """Book one hotel room for a stay of 1-14 nights starting today or later.

        The hotel must have a free room for every night of the stay.

        Args:
            traveler_id: The traveler the room is booked for.
            hotel_id: The hotel, e.g. "H002".
            check_in: Arrival date, "YYYY-MM-DD".
            check_out: Departure date, "YYYY-MM-DD".

        Returns:
            dict: {"success": True, "data": BookingInfo} with the total price, or {"success": False, "error": str}.
        """
        if self._lookup(self.travelers, traveler_id) is None:
            return {"success": False, "error": f"Traveler '{traveler_id}' not found"}
        hotel = self._lookup(self.hotels, hotel_id)
        if hotel is None:
            return {"success": False, "error": f"Hotel '{hotel_id}' not found"}
        nights, problem = self._stay_problem(check_in, check_out)
        if problem:
            return {"success": False, "error": problem}
        if self._rooms_free(hotel_id, check_in, check_out) <= 0:
            return {"success": False, "error": f"{hotel.get('name')} has no free room for {check_in} to {check_out}"}
        price = float(hotel.get("nightly_rate", 0)) * nights
        booking = self._booking(traveler_id, "hotel", price, hotel_id=hotel_id, check_in=check_in, check_out=check_out)
        return {"success": True, "data": dict(booking)}

    def cancel_booking(self, booking_id: str) -> dict:
        """Cancel a confirmed booking and work out the refund.

        Flights: full refund when the airline cancelled the flight, for gold travelers, or
        7 or more days before departure; otherwise half the price. The seat is released.
        Hotels: full refund up to the day before check-in; from check-in day the first night is kept.
        Change fees already paid are never refunded.

        Args:
            booking_id: The booking to cancel, e.g. "B0002".

        Returns:
            dict: {"success": True, "data": {"booking_id", "refund_amount"}} or {"success": False, "error": str}.
        """
        booking = self._lookup(self.bookings, booking_id)
        if booking is None:
            return {"success": False, "error": f"Booking '{booking_id}' not found"}
        if booking.get("status") != "confirmed":
            return {"success": False, "error": f"Booking '{booking_id}' is already cancelled"}
        price = float(booking.get("price", 0))
        today = dt.date.fromisoformat(self.current_date)
        if booking.get("kind") == "flight":
            flight = self.flights.get(booking.get("flight_id") or "") or {}
            if str(flight.get("departure", ""))[:10] < self.current_date:
                return {"success": False, "error": "The flight has already departed"}
            traveler = self.travelers.get(booking.get("traveler_id", "")) or {}
            days = (dt.date.fromisoformat(str(flight.get("departure"))[:10]) - today).days
            full = (flight.get("status") == "cancelled" or traveler.get("loyalty_tier") == "gold"
                    or days >= self.full_refund_days)
            refund = price if full else round(price / 2, 2)
            seats = flight.get("cabins", {}).get(booking.get("cabin") or "")
            if seats is not None:
                seats["seats_left"] = int(seats.get("seats_left", 0)) + 1
        else:
            if str(booking.get("check_out", "")) <= self.current_date:
                return {"success": False, "error": "The stay is already over"}
            hotel = self.hotels.get(booking.get("hotel_id") or "") or {}
            early = str(booking.get("check_in", "")) > self.current_date
            refund = price if early else round(max(price - float(hotel.get("nightly_rate", 0)), 0.0), 2)
        booking["status"] = "cancelled"
        booking["refund_amount"] = refund
        return {"success": True, "data": {"booking_id": booking_id, "refund_amount": refund}}

    def change_flight(self, booking_id: str, new_flight_id: str) -> dict:
        """Move a confirmed flight booking to another flight on the same route, in the same cabin.

        The new flight must pass every booking rule. The fare becomes the new flight's
        fare, and a change fee of 50.00 is charged unless the traveler is gold.

        Args:
            booking_id: The flight booking to move.
            new_flight_id: The flight to move it to.

        Returns:
            dict: {"success": True, "data": BookingInfo plus "fare_difference" and "fee_charged"} or
            {"success": False, "error": str}.
        """
        booking = self._lookup(self.bookings, booking_id)
        if booking is None or booking.get("kind") != "flight":
            return {"success": False, "error": f"Flight booking '{booking_id}' not found"}
        if booking.get("status") != "confirmed":
            return {"success": False, "error": f"Booking '{booking_id}' is cancelled"}
        old = self.flights.get(booking.get("flight_id") or "")
        new = self._lookup(self.flights, new_flight_id)
        if old is None or new is None:
            return {"success": False, "error": f"Flight '{new_flight_id}' not found"}
        if new_flight_id == booking.get("flight_id"):
            return {"success": False, "error": f"Booking '{booking_id}' is already on that flight"}
        if (old.get("origin"), old.get("destination")) != (new.get("origin"), new.get("destination")):
            return {"success": False, "error": "A booking can only move to a flight on the same route"}
        if str(old.get("departure", ""))[:10] < self.current_date:
            return {"success": False, "error": "The booked flight has already departed"}
        traveler = self.travelers.get(booking.get("traveler_id", ""))
        if traveler is None:
            return {"success": False, "error": "The booking's traveler no longer exists"}
        cabin = booking.get("cabin")
        problem = self._flight_problem(traveler, new, cabin, skip=booking_id)
        if problem:
            return {"success": False, "error": problem}
        old_seats = old.get("cabins", {}).get(cabin or "")
        if old_seats is not None:
            old_seats["seats_left"] = int(old_seats.get("seats_left", 0)) + 1
        new_seats = new["cabins"][cabin or ""]
        new_seats["seats_left"] = int(new_seats.get("seats_left", 0)) - 1
        fee = 0.0 if traveler.get("loyalty_tier") == "gold" else float(self.change_fee)
        new_price = round(float(new_seats.get("price", 0)), 2)
        difference = round(new_price - float(booking.get("price", 0)), 2)
        booking["flight_id"] = new_flight_id
        booking["price"] = new_price
        booking["change_fees"] = round(float(booking.get("change_fees", 0)) + fee, 2)
        data: Dict[str, Any] = dict(booking)
        data["fare_difference"] = difference
        data["fee_charged"] = fee
        return {"success": True, "data": data}
