"""Client for envfoundry: stateful tool environments for LLM agents over HTTP.

    from envfoundry_client import Client
    with Client("http://127.0.0.1:8000") as ef:
        session = ef.create_session("lib-001")
        ef.call(session.session_id, "list_member_loans", {"member_id": "M002"})
        print(ef.score(session.session_id).reward)
"""

__version__ = "0.1.0"

from envfoundry_client.client import AsyncClient, Client  # noqa: E402
from envfoundry_client.errors import (  # noqa: E402
    Conflict,
    ConversationEnded,
    EnvfoundryError,
    Forbidden,
    IdempotencyKeyReused,
    InvalidEnvironment,
    InvalidRequest,
    NotConversation,
    NotFound,
    NotTurnBased,
    PayloadTooLarge,
    ProblemError,
    ProtocolError,
    QuotaExceeded,
    SessionBusy,
    TransportError,
    TurnsEnded,
    Unauthorized,
    Unavailable,
    UserLLMFailed,
    UserLLMUnavailable,
)
from envfoundry_client.exchange import Retry  # noqa: E402
from envfoundry_client.models import (  # noqa: E402
    CallError,
    CallResult,
    CallStep,
    CheckItem,
    CheckResult,
    Environment,
    EnvironmentSummary,
    MessageReply,
    MessageStep,
    Scenario,
    ScenarioPage,
    ScenarioSummary,
    Score,
    Session,
    SessionInfo,
    StateView,
    Step,
    ToolCall,
    TrajectoryPage,
    TurnStep,
)
from envfoundry_client.turns import TurnResult, TurnScore, TurnView  # noqa: E402

__all__ = [
    "AsyncClient", "CallError", "CallResult", "CallStep", "CheckItem", "CheckResult", "Client", "Conflict",
    "ConversationEnded", "EnvfoundryError", "Environment", "EnvironmentSummary", "Forbidden", "IdempotencyKeyReused",
    "InvalidEnvironment", "InvalidRequest", "MessageReply", "MessageStep", "NotConversation", "NotFound",
    "PayloadTooLarge", "ProblemError", "ProtocolError", "QuotaExceeded", "Retry", "Scenario", "ScenarioPage", "ScenarioSummary",
    "Score", "Session", "SessionBusy", "SessionInfo", "StateView", "Step", "ToolCall", "TrajectoryPage",
    "TransportError", "Unauthorized", "Unavailable", "UserLLMFailed", "UserLLMUnavailable",
    "NotTurnBased", "TurnsEnded", "TurnResult", "TurnScore", "TurnStep", "TurnView",
]
