import datetime as dt
from typing import Any, Dict, List, Literal, Optional, Tuple, TypedDict


class PatientInfo(TypedDict):
    patient_id: str
    name: str
    date_of_birth: str
    phone: str
    status: Literal["active", "inactive"]
    no_show_count: int


class DoctorInfo(TypedDict):
    doctor_id: str
    name: str
    specialty: str
    working_days: List[str]
    start_time: str
    end_time: str
    accepting_new_patients: bool


class AppointmentInfo(TypedDict):
    appointment_id: str
    patient_id: str
    doctor_id: str
    date: str
    start_time: str
    duration_minutes: int
    reason: str
    status: Literal["scheduled", "completed", "cancelled", "no_show"]
    cancel_reason: Optional[str]
    late_cancellation: bool
    visit_notes: Optional[str]


WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
DURATIONS = (15, 30, 45, 60)


class ClinicSchedulingDesk:
    """Front desk of an outpatient clinic: patients, doctors' hours and appointments."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Patients: {patient_id: PatientInfo}
        self.patients: Dict[str, PatientInfo] = {}
        # Doctors: {doctor_id: DoctorInfo}; working_days use "Mon".."Sun", times are "HH:MM"
        self.doctors: Dict[str, DoctorInfo] = {}
        # Appointments: {appointment_id: AppointmentInfo}
        self.appointments: Dict[str, AppointmentInfo] = {}
        # Today's date at the desk (ISO format)
        self.current_date: str = "2024-06-03"
        # Scheduled appointments from today on that one patient may hold
        self.max_upcoming_per_patient: int = 3
        # Missed appointments after which a patient can no longer book at the desk
        self.no_show_limit: int = 3

    # ------------------------------------------------------------------ helpers

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _parse_date(self, value: Any) -> Optional[dt.date]:
        if not isinstance(value, str):
            return None
        try:
            parsed = dt.date.fromisoformat(value)
        except ValueError:
            return None
        # Dates are compared as strings elsewhere, so only the canonical form is accepted.
        return parsed if parsed.isoformat() == value else None

    def _minutes(self, value: Any) -> Optional[int]:
        if not isinstance(value, str):
            return None
        try:
            parsed = dt.datetime.strptime(value, "%H:%M")
        except ValueError:
            return None
        return parsed.hour * 60 + parsed.minute

    def _clock(self, minutes: int) -> str:
        return f"{minutes // 60:02d}:{minutes % 60:02d}"

    def _span(self, appointment: AppointmentInfo) -> Tuple[int, int]:
        start = self._minutes(appointment.get("start_time")) or 0
        return start, start + int(appointment.get("duration_minutes", 0))

    def _busy(self, key: str, value: str, day: str, skip: Optional[str] = None) -> List[AppointmentInfo]:
        return [
            a for a in self.appointments.values()
            if a.get(key) == value and a.get("date") == day and a.get("status") == "scheduled"
            and a.get("appointment_id") != skip
        ]

    def _upcoming_of(self, patient_id: str, skip: Optional[str] = None) -> List[AppointmentInfo]:
        return [
            a for a in self.appointments.values()
            if a.get("patient_id") == patient_id and a.get("status") == "scheduled"
            and str(a.get("date", "")) >= self.current_date and a.get("appointment_id") != skip
        ]

    def _slot_problem(
        self, doctor: DoctorInfo, patient_id: str, day: Any, start_time: Any, duration: Any,
        skip: Optional[str] = None,
    ) -> Optional[str]:
        """Why a slot cannot be booked, or None when it can."""
        when = self._parse_date(day)
        if when is None:
            return f"Date '{day}' is not an ISO date (YYYY-MM-DD)"
        if str(day) < self.current_date:
            return f"Date {day} is in the past"
        start = self._minutes(start_time)
        if start is None:
            return f"Start time '{start_time}' is not HH:MM"
        if start % 15:
            return "Appointments start on the quarter hour (:00, :15, :30, :45)"
        if isinstance(duration, bool) or duration not in DURATIONS:
            return f"Duration must be one of {list(DURATIONS)} minutes"
        weekday = WEEKDAYS[when.weekday()]
        if weekday not in doctor.get("working_days", []):
            return f"{doctor.get('name')} does not work on {weekday}"
        opens = self._minutes(doctor.get("start_time")) or 0
        closes = self._minutes(doctor.get("end_time")) or 0
        if start < opens or start + duration > closes:
            return (f"{doctor.get('name')} sees patients {doctor.get('start_time')}-{doctor.get('end_time')}; "
                    f"{start_time} for {duration} minutes does not fit")
        end = start + duration
        for other in self._busy("doctor_id", doctor.get("doctor_id", ""), str(day), skip):
            other_start, other_end = self._span(other)
            if start < other_end and other_start < end:
                return f"{doctor.get('name')} is already booked {other.get('start_time')} ({other.get('appointment_id')})"
        for other in self._busy("patient_id", patient_id, str(day), skip):
            other_start, other_end = self._span(other)
            if start < other_end and other_start < end:
                return f"The patient already has appointment {other.get('appointment_id')} at {other.get('start_time')}"
        return None

    def _scheduled(self, appointment_id: Any, when: Literal["upcoming", "due"]) -> Tuple[Optional[AppointmentInfo], str]:
        """The scheduled appointment if it is dated today or later ("upcoming") or today or
        earlier ("due"), else None and the reason."""
        appointment = self._lookup(self.appointments, appointment_id)
        if appointment is None:
            return None, f"Appointment '{appointment_id}' not found"
        if appointment.get("status") != "scheduled":
            return None, f"Appointment '{appointment_id}' is {appointment.get('status')}, not scheduled"
        day = str(appointment.get("date", ""))
        if when == "upcoming" and day < self.current_date:
            return None, f"Appointment '{appointment_id}' was on {day}, in the past; complete it or mark a no-show"
        if when == "due" and day > self.current_date:
            return None, f"Appointment '{appointment_id}' is on {day}, in the future"
        return appointment, ""

    def _next_appointment_id(self) -> str:
        n = len(self.appointments) + 1
        while f"A{n:04d}" in self.appointments:
            n += 1
        return f"A{n:04d}"

    def _next_patient_id(self) -> str:
        n = len(self.patients) + 1
        while f"P{n:03d}" in self.patients:
            n += 1
        return f"P{n:03d}"

    # ------------------------------------------------------------------ queries

    def find_patient(self, name: str) -> dict:
        """Find patients whose name contains the given text (case-insensitive).

        Args:
            name: Part of the patient's name, e.g. "Okafor".

        Returns:
            dict: {"success": True, "data": List[PatientInfo]} (possibly empty) or
            {"success": False, "error": str} when the name is empty.
        """
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "Name must be a non-empty string"}
        needle = name.strip().lower()
        matches = [dict(p) for p in self.patients.values() if needle in str(p.get("name", "")).lower()]
        return {"success": True, "data": matches}

    def get_patient(self, patient_id: str) -> dict:
        """Get a patient's record with their count of upcoming appointments.

        Args:
            patient_id: The patient's id, e.g. "P001".

        Returns:
            dict: {"success": True, "data": PatientInfo plus "upcoming_appointments" (int)} or
            {"success": False, "error": str} when the patient does not exist.
        """
        patient = self._lookup(self.patients, patient_id)
        if patient is None:
            return {"success": False, "error": f"Patient '{patient_id}' not found"}
        data = dict(patient)
        data["upcoming_appointments"] = len(self._upcoming_of(patient_id))
        return {"success": True, "data": data}

    def list_doctors(self, specialty: Optional[str] = None) -> dict:
        """List the clinic's doctors, optionally only one specialty.

        Args:
            specialty: Only doctors with this specialty (case-insensitive), e.g. "Dermatology"; all when omitted.

        Returns:
            dict: {"success": True, "data": List[DoctorInfo]} (possibly empty).
        """
        wanted = specialty.strip().lower() if isinstance(specialty, str) else None
        doctors = [
            dict(d) for d in self.doctors.values()
            if wanted is None or str(d.get("specialty", "")).lower() == wanted
        ]
        return {"success": True, "data": doctors}

    def find_available_slots(self, doctor_id: str, date: str, duration_minutes: int = 30) -> dict:
        """List the start times at which a doctor is free for an appointment of the given length.

        Start times are on the quarter hour within the doctor's working hours.

        Args:
            doctor_id: The doctor's id, e.g. "D001".
            date: The day to look at, "YYYY-MM-DD".
            duration_minutes: Length of the appointment: 15, 30, 45 or 60.

        Returns:
            dict: {"success": True, "data": List[str]} of "HH:MM" start times (empty when the
            doctor does not work that day or is fully booked), or {"success": False, "error": str}.
        """
        doctor = self._lookup(self.doctors, doctor_id)
        if doctor is None:
            return {"success": False, "error": f"Doctor '{doctor_id}' not found"}
        when = self._parse_date(date)
        if when is None:
            return {"success": False, "error": f"Date '{date}' is not an ISO date (YYYY-MM-DD)"}
        if isinstance(duration_minutes, bool) or duration_minutes not in DURATIONS:
            return {"success": False, "error": f"Duration must be one of {list(DURATIONS)} minutes"}
        if date < self.current_date or WEEKDAYS[when.weekday()] not in doctor.get("working_days", []):
            return {"success": True, "data": []}
        opens = self._minutes(doctor.get("start_time")) or 0
        closes = self._minutes(doctor.get("end_time")) or 0
        taken = [self._span(a) for a in self._busy("doctor_id", doctor_id, date)]
        free = []
        for start in range(opens - opens % 15 + (15 if opens % 15 else 0), closes - duration_minutes + 1, 15):
            end = start + duration_minutes
            if all(end <= s or e <= start for s, e in taken):
                free.append(self._clock(start))
        return {"success": True, "data": free}

    def list_patient_appointments(self, patient_id: str, include_past: bool = False) -> dict:
        """List a patient's appointments with the doctor's name, earliest first.

        Args:
            patient_id: The patient's id.
            include_past: If True, also list appointments before today and ones no longer scheduled.

        Returns:
            dict: {"success": True, "data": List[AppointmentInfo plus "doctor_name"]} or
            {"success": False, "error": str} when the patient does not exist.
        """
        if self._lookup(self.patients, patient_id) is None:
            return {"success": False, "error": f"Patient '{patient_id}' not found"}
        results = []
        for appointment in self.appointments.values():
            if appointment.get("patient_id") != patient_id:
                continue
            current = appointment.get("status") == "scheduled" and str(appointment.get("date", "")) >= self.current_date
            if not current and not include_past:
                continue
            entry = dict(appointment)
            entry["doctor_name"] = self.doctors.get(appointment.get("doctor_id", ""), {}).get("name")
            results.append(entry)
        results.sort(key=lambda a: (str(a.get("date")), str(a.get("start_time"))))
        return {"success": True, "data": results}

    # ------------------------------------------------------------ state changes

    def register_patient(self, name: str, date_of_birth: str, phone: str) -> dict:
        """Register a new patient with the clinic.

        A patient with the same name and date of birth may not be registered twice.

        Args:
            name: The patient's full name.
            date_of_birth: Birth date, "YYYY-MM-DD" (not in the future).
            phone: A contact phone number.

        Returns:
            dict: {"success": True, "data": PatientInfo} with the new patient id, or
            {"success": False, "error": str}.
        """
        if not isinstance(name, str) or not name.strip():
            return {"success": False, "error": "A name is required"}
        born = self._parse_date(date_of_birth)
        if born is None or date_of_birth > self.current_date:
            return {"success": False, "error": f"Date of birth '{date_of_birth}' is not a valid past date"}
        if not isinstance(phone, str) or not phone.strip():
            return {"success": False, "error": "A phone number is required"}
        for other in self.patients.values():
            if str(other.get("name", "")).lower() == name.strip().lower() and other.get("date_of_birth") == date_of_birth:
                return {"success": False, "error": f"Already registered as '{other.get('patient_id')}'"}
        patient_id = self._next_patient_id()
        patient: PatientInfo = {
            "patient_id": patient_id,
            "name": name.strip(),
            "date_of_birth": date_of_birth,
            "phone": phone.strip(),
            "status": "active",
            "no_show_count": 0,
        }
        self.patients[patient_id] = patient
        return {"success": True, "data": dict(patient)}

    def book_appointment(
        self,
        patient_id: str,
        doctor_id: str,
        date: str,
        start_time: str,
        reason: str,
        duration_minutes: int = 30,
    ) -> dict:
        """Book an appointment for a patient with a doctor.

        The slot must be today or later, start on the quarter hour, fit inside the
        doctor's working day and hours, and overlap none of the doctor's or the
        patient's scheduled appointments. The patient must be active, below the
        no-show limit and the limit of upcoming appointments; a doctor who is not
        accepting new patients only books patients they have seen before.

        Args:
            patient_id: The patient's id.
            doctor_id: The doctor's id.
            date: The day, "YYYY-MM-DD".
            start_time: The start, "HH:MM" on a quarter hour.
            reason: Why the patient is coming in.
            duration_minutes: Length of the appointment: 15, 30, 45 or 60.

        Returns:
            dict: {"success": True, "data": AppointmentInfo} with the new appointment, or
            {"success": False, "error": str} naming the rule that blocked it.
        """
        patient = self._lookup(self.patients, patient_id)
        if patient is None:
            return {"success": False, "error": f"Patient '{patient_id}' not found"}
        doctor = self._lookup(self.doctors, doctor_id)
        if doctor is None:
            return {"success": False, "error": f"Doctor '{doctor_id}' not found"}
        if patient.get("status") != "active":
            return {"success": False, "error": f"Patient '{patient_id}' is inactive and cannot book"}
        if int(patient.get("no_show_count", 0)) >= self.no_show_limit:
            return {"success": False, "error": f"Patient '{patient_id}' has {patient.get('no_show_count')} missed appointments; booking needs the practice manager"}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A reason for the visit is required"}
        if len(self._upcoming_of(patient_id)) >= self.max_upcoming_per_patient:
            return {"success": False, "error": f"Patient '{patient_id}' already has {self.max_upcoming_per_patient} upcoming appointments"}
        if not doctor.get("accepting_new_patients", True):
            seen = any(
                a.get("patient_id") == patient_id and a.get("doctor_id") == doctor_id
                and a.get("status") in ("scheduled", "completed")
                for a in self.appointments.values()
            )
            if not seen:
                return {"success": False, "error": f"{doctor.get('name')} is not accepting new patients"}
        problem = self._slot_problem(doctor, patient_id, date, start_time, duration_minutes)
        if problem:
            return {"success": False, "error": problem}
        appointment_id = self._next_appointment_id()
        appointment: AppointmentInfo = {
            "appointment_id": appointment_id,
            "patient_id": patient_id,
            "doctor_id": doctor_id,
            "date": date,
            "start_time": start_time,
            "duration_minutes": duration_minutes,
            "reason": reason.strip(),
            "status": "scheduled",
            "cancel_reason": None,
            "late_cancellation": False,
            "visit_notes": None,
        }
        self.appointments[appointment_id] = appointment
        return {"success": True, "data": dict(appointment)}

    def reschedule_appointment(self, appointment_id: str, new_date: str, new_start_time: str) -> dict:
        """Move a scheduled appointment to another time with the same doctor.

        The new slot follows the same rules as a booking; the length stays the same.

        Args:
            appointment_id: The appointment to move, e.g. "A0004".
            new_date: The new day, "YYYY-MM-DD".
            new_start_time: The new start, "HH:MM" on a quarter hour.

        Returns:
            dict: {"success": True, "data": AppointmentInfo} or {"success": False, "error": str}.
        """
        appointment, problem = self._scheduled(appointment_id, "upcoming")
        if appointment is None:
            return {"success": False, "error": problem}
        doctor = self.doctors.get(appointment.get("doctor_id", ""))
        if doctor is None:
            return {"success": False, "error": "The appointment's doctor no longer exists"}
        problem = self._slot_problem(
            doctor, appointment.get("patient_id", ""), new_date, new_start_time,
            appointment.get("duration_minutes"), skip=appointment_id,
        )
        if problem:
            return {"success": False, "error": problem}
        appointment["date"] = new_date
        appointment["start_time"] = new_start_time
        return {"success": True, "data": dict(appointment)}

    def cancel_appointment(self, appointment_id: str, reason: str) -> dict:
        """Cancel a scheduled appointment, freeing the slot.

        Cancelling on the day of the appointment is allowed but recorded as a late cancellation.

        Args:
            appointment_id: The appointment to cancel.
            reason: Why it is cancelled.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        appointment, problem = self._scheduled(appointment_id, "upcoming")
        if appointment is None:
            return {"success": False, "error": problem}
        if not isinstance(reason, str) or not reason.strip():
            return {"success": False, "error": "A cancellation reason is required"}
        appointment["status"] = "cancelled"
        appointment["cancel_reason"] = reason.strip()
        appointment["late_cancellation"] = appointment.get("date") == self.current_date
        note = " (late cancellation)" if appointment["late_cancellation"] else ""
        return {"success": True, "message": f"Appointment '{appointment_id}' cancelled{note}"}

    def complete_appointment(self, appointment_id: str, visit_notes: str) -> dict:
        """Record that a scheduled appointment took place.

        Only appointments dated today or earlier can be completed.

        Args:
            appointment_id: The appointment that took place.
            visit_notes: The doctor's short notes on the visit.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        appointment, problem = self._scheduled(appointment_id, "due")
        if appointment is None:
            return {"success": False, "error": problem}
        if not isinstance(visit_notes, str) or not visit_notes.strip():
            return {"success": False, "error": "Visit notes are required"}
        appointment["status"] = "completed"
        appointment["visit_notes"] = visit_notes.strip()
        return {"success": True, "message": f"Appointment '{appointment_id}' completed"}

    def mark_no_show(self, appointment_id: str) -> dict:
        """Record that the patient missed a scheduled appointment dated today or earlier.

        The patient's no-show count goes up by one.

        Args:
            appointment_id: The missed appointment.

        Returns:
            dict: {"success": True, "data": {"appointment_id", "patient_id", "no_show_count"}} or
            {"success": False, "error": str}.
        """
        appointment, problem = self._scheduled(appointment_id, "due")
        if appointment is None:
            return {"success": False, "error": problem}
        appointment["status"] = "no_show"
        patient = self.patients.get(appointment.get("patient_id", ""))
        count = 0
        if patient is not None:
            patient["no_show_count"] = int(patient.get("no_show_count", 0)) + 1
            count = patient["no_show_count"]
        return {"success": True, "data": {"appointment_id": appointment_id,
                                          "patient_id": appointment.get("patient_id"), "no_show_count": count}}
