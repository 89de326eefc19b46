import re
from typing import Any, Dict, List, Literal, Optional, TypedDict


class UserInfo(TypedDict):
    user_id: str
    display_name: str
    role: Literal["admin", "member"]
    status: Literal["active", "deactivated"]
    blocked_user_ids: List[str]


class ChannelInfo(TypedDict):
    channel_id: str
    name: str
    topic: str
    is_private: bool
    owner_id: str
    member_ids: List[str]
    archived: bool
    pinned_message_ids: List[str]


class MessageInfo(TypedDict):
    message_id: str
    channel_id: Optional[str]
    recipient_id: Optional[str]
    sender_id: str
    text: str
    sent_at: str
    edited: bool
    deleted: bool


CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,29}$")


class TeamChatWorkspace:
    """A team chat workspace seen through one signed-in user: channels, direct messages, pins and blocks."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Users: {user_id: UserInfo}
        self.users: Dict[str, UserInfo] = {}
        # Channels: {channel_id: ChannelInfo}
        self.channels: Dict[str, ChannelInfo] = {}
        # Messages: {message_id: MessageInfo}; a channel message has channel_id, a direct message recipient_id
        self.messages: Dict[str, MessageInfo] = {}
        # The signed-in user every call acts for
        self.current_user: str = "U001"
        # Timestamp given to messages sent now (ISO format)
        self.current_time: str = "2024-04-08T10:00:00"
        # Longest message, in characters
        self.max_message_length: int = 500
        # Most pinned messages a channel may have
        self.max_pins: int = 3

    # ------------------------------------------------------------------ helpers

    def _lookup(self, table: Dict[str, Any], key: Any) -> Any:
        # Ids come from the agent: anything that is not a string matches nothing.
        return table.get(key) if isinstance(key, str) else None

    def _me(self) -> Optional[UserInfo]:
        return self._lookup(self.users, self.current_user)

    def _is_admin(self) -> bool:
        return (self._me() or {}).get("role") == "admin"

    def _is_member(self, channel: ChannelInfo) -> bool:
        return self.current_user in channel.get("member_ids", [])

    def _visible_channel(self, channel_id: Any) -> Optional[ChannelInfo]:
        # A private channel does not exist for non-members, so they get the same answer as for a wrong id.
        channel = self._lookup(self.channels, channel_id)
        if channel is None or (channel.get("is_private") and not self._is_member(channel)):
            return None
        return channel

    def _text_problem(self, text: Any) -> Optional[str]:
        if not isinstance(text, str) or not text.strip():
            return "Message text must be a non-empty string"
        if len(text) > self.max_message_length:
            return f"Messages are at most {self.max_message_length} characters ({len(text)} given)"
        return None

    def _channel_for_posting(self, channel_id: Any) -> Any:
        """The channel if the current user may post in it, else an error string."""
        channel = self._visible_channel(channel_id)
        if channel is None:
            return f"Channel '{channel_id}' not found"
        if channel.get("archived"):
            return f"#{channel.get('name')} is archived and read-only"
        if not self._is_member(channel):
            return f"Join #{channel.get('name')} before posting or pinning there"
        return channel

    def _new_message(self, channel_id: Optional[str], recipient_id: Optional[str], text: str) -> MessageInfo:
        n = len(self.messages) + 1
        while f"MSG{n:04d}" in self.messages:
            n += 1
        message: MessageInfo = {
            "message_id": f"MSG{n:04d}",
            "channel_id": channel_id,
            "recipient_id": recipient_id,
            "sender_id": self.current_user,
            "text": text,
            "sent_at": self.current_time,
            "edited": False,
            "deleted": False,
        }
        self.messages[message["message_id"]] = message
        return message

    # ------------------------------------------------------------------ queries

    def find_user(self, query: str) -> dict:
        """Find people whose display name contains the text (case-insensitive) or whose user id equals it.

        Args:
            query: Part of a display name, e.g. "Priya", or a user id, e.g. "U004".

        Returns:
            dict: {"success": True, "data": List[{"user_id", "display_name", "role", "status"}]} or
            {"success": False, "error": str} when the query is empty.
        """
        if not isinstance(query, str) or not query.strip():
            return {"success": False, "error": "Query must be a non-empty string"}
        needle = query.strip().lower()
        people = [
            {k: u.get(k) for k in ("user_id", "display_name", "role", "status")}
            for u in self.users.values()
            if needle in str(u.get("display_name", "")).lower() or needle == str(u.get("user_id", "")).lower()
        ]
        return {"success": True, "data": people}

    def list_channels(self, include_archived: bool = False) -> dict:
        """List the channels the signed-in user can see: every public channel and the private ones they belong to.

        Args:
            include_archived: If True, also list archived channels.

        Returns:
            dict: {"success": True, "data": List[ChannelInfo plus "is_member" (bool)]}.
        """
        visible = []
        for channel in self.channels.values():
            if channel.get("is_private") and not self._is_member(channel):
                continue
            if channel.get("archived") and not include_archived:
                continue
            entry = dict(channel)
            entry["is_member"] = self._is_member(channel)
            visible.append(entry)
        return {"success": True, "data": visible}

    def get_channel_history(self, channel_id: str, limit: int = 20) -> dict:
        """Read the latest messages of a channel the signed-in user belongs to, oldest first.

        Deleted messages are left out.

        Args:
            channel_id: The channel's id, e.g. "C001".
            limit: How many of the latest messages to return (1-100).

        Returns:
            dict: {"success": True, "data": List[MessageInfo]} or {"success": False, "error": str}.
        """
        channel = self._visible_channel(channel_id)
        if channel is None:
            return {"success": False, "error": f"Channel '{channel_id}' not found"}
        if not self._is_member(channel):
            return {"success": False, "error": f"Join #{channel.get('name')} to read its messages"}
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            return {"success": False, "error": "Limit must be an integer from 1 to 100"}
        history = [
            dict(m) for m in self.messages.values()
            if m.get("channel_id") == channel_id and not m.get("deleted")
        ]
        history.sort(key=lambda m: (str(m.get("sent_at")), str(m.get("message_id"))))
        return {"success": True, "data": history[-limit:]}

    def get_direct_messages(self, user_id: str, limit: int = 20) -> dict:
        """Read the latest direct messages between the signed-in user and another person, oldest first.

        Args:
            user_id: The other person's user id.
            limit: How many of the latest messages to return (1-100).

        Returns:
            dict: {"success": True, "data": List[MessageInfo]} or {"success": False, "error": str}.
        """
        if self._lookup(self.users, user_id) is None:
            return {"success": False, "error": f"User '{user_id}' not found"}
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100:
            return {"success": False, "error": "Limit must be an integer from 1 to 100"}
        pair = {self.current_user, user_id}
        conversation = [
            dict(m) for m in self.messages.values()
            if m.get("recipient_id") is not None and not m.get("deleted")
            and {m.get("sender_id"), m.get("recipient_id")} == pair
        ]
        conversation.sort(key=lambda m: (str(m.get("sent_at")), str(m.get("message_id"))))
        return {"success": True, "data": conversation[-limit:]}

    # ------------------------------------------------------------ state changes

    def create_channel(self, name: str, topic: str, is_private: bool = False) -> dict:
        """Create a channel owned by the signed-in user, who becomes its first member.

        Args:
            name: Lowercase letters, digits and hyphens, 1-30 characters, starting with a letter or digit; unique.
            topic: What the channel is for.
            is_private: If True, only invited members can see and join it.

        Returns:
            dict: {"success": True, "data": ChannelInfo} or {"success": False, "error": str}.
        """
        if not isinstance(name, str) or not CHANNEL_NAME.match(name):
            return {"success": False, "error": "Channel names use lowercase letters, digits and hyphens (1-30 characters)"}
        if any(c.get("name") == name for c in self.channels.values()):
            return {"success": False, "error": f"A channel named #{name} already exists"}
        if not isinstance(topic, str):
            return {"success": False, "error": "Topic must be a string"}
        n = len(self.channels) + 1
        while f"C{n:03d}" in self.channels:
            n += 1
        channel: ChannelInfo = {
            "channel_id": f"C{n:03d}",
            "name": name,
            "topic": topic.strip(),
            "is_private": bool(is_private),
            "owner_id": self.current_user,
            "member_ids": [self.current_user],
            "archived": False,
            "pinned_message_ids": [],
        }
        self.channels[channel["channel_id"]] = channel
        return {"success": True, "data": dict(channel)}

    def join_channel(self, channel_id: str) -> dict:
        """Join a public, non-archived channel.

        Args:
            channel_id: The channel to join.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        channel = self._visible_channel(channel_id)
        if channel is None:
            return {"success": False, "error": f"Channel '{channel_id}' not found"}
        if self._is_member(channel):
            return {"success": False, "error": f"Already a member of #{channel.get('name')}"}
        if channel.get("archived"):
            return {"success": False, "error": f"#{channel.get('name')} is archived"}
        channel["member_ids"] = channel.get("member_ids", []) + [self.current_user]
        return {"success": True, "message": f"Joined #{channel.get('name')}"}

    def invite_to_channel(self, channel_id: str, user_id: str) -> dict:
        """Add another active person to a channel the signed-in user belongs to.

        Any member may invite to a public channel; only the owner (or an admin) may invite to a private one.

        Args:
            channel_id: The channel.
            user_id: The person to add.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        channel = self._channel_for_posting(channel_id)
        if isinstance(channel, str):
            return {"success": False, "error": channel}
        user = self._lookup(self.users, user_id)
        if user is None:
            return {"success": False, "error": f"User '{user_id}' not found"}
        if user.get("status") != "active":
            return {"success": False, "error": f"{user.get('display_name')} is deactivated"}
        if user_id in channel.get("member_ids", []):
            return {"success": False, "error": f"{user.get('display_name')} is already in #{channel.get('name')}"}
        if channel.get("is_private") and channel.get("owner_id") != self.current_user and not self._is_admin():
            return {"success": False, "error": f"Only the owner can invite people to the private channel #{channel.get('name')}"}
        channel["member_ids"] = channel.get("member_ids", []) + [user_id]
        return {"success": True, "message": f"{user.get('display_name')} added to #{channel.get('name')}"}

    def send_message(self, channel_id: str, text: str) -> dict:
        """Post a message in a channel the signed-in user belongs to (not archived).

        Args:
            channel_id: The channel to post in.
            text: The message, 1-500 characters.

        Returns:
            dict: {"success": True, "data": MessageInfo} or {"success": False, "error": str}.
        """
        channel = self._channel_for_posting(channel_id)
        if isinstance(channel, str):
            return {"success": False, "error": channel}
        problem = self._text_problem(text)
        if problem:
            return {"success": False, "error": problem}
        return {"success": True, "data": dict(self._new_message(channel_id, None, text))}

    def send_direct_message(self, user_id: str, text: str) -> dict:
        """Send a private message to another person.

        Not possible to deactivated people, or when either side blocked the other.

        Args:
            user_id: The recipient.
            text: The message, 1-500 characters.

        Returns:
            dict: {"success": True, "data": MessageInfo} or {"success": False, "error": str}.
        """
        user = self._lookup(self.users, user_id)
        if user is None:
            return {"success": False, "error": f"User '{user_id}' not found"}
        if user_id == self.current_user:
            return {"success": False, "error": "You cannot send a direct message to yourself"}
        if user.get("status") != "active":
            return {"success": False, "error": f"{user.get('display_name')} is deactivated"}
        if self.current_user in user.get("blocked_user_ids", []):
            return {"success": False, "error": f"{user.get('display_name')} does not accept your messages"}
        if user_id in (self._me() or {}).get("blocked_user_ids", []):
            return {"success": False, "error": f"You blocked {user.get('display_name')}; unblock them first"}
        problem = self._text_problem(text)
        if problem:
            return {"success": False, "error": problem}
        return {"success": True, "data": dict(self._new_message(None, user_id, text))}

    def edit_message(self, message_id: str, new_text: str) -> dict:
        """Change the text of a message the signed-in user sent (not in an archived channel).

        Args:
            message_id: The message to edit, e.g. "MSG0012".
            new_text: The replacement text, 1-500 characters.

        Returns:
            dict: {"success": True, "data": MessageInfo} or {"success": False, "error": str}.
        """
        message = self._lookup(self.messages, message_id)
        if message is None or message.get("deleted"):
            return {"success": False, "error": f"Message '{message_id}' not found"}
        if message.get("sender_id") != self.current_user:
            return {"success": False, "error": "Only the author can edit a message"}
        channel = self.channels.get(message.get("channel_id") or "")
        if channel is not None and channel.get("archived"):
            return {"success": False, "error": f"#{channel.get('name')} is archived and read-only"}
        problem = self._text_problem(new_text)
        if problem:
            return {"success": False, "error": problem}
        message["text"] = new_text
        message["edited"] = True
        return {"success": True, "data": dict(message)}

    def delete_message(self, message_id: str) -> dict:
        """Delete a message: the author, the channel's owner or an admin may; it also leaves the pins.

        Args:
            message_id: The message to delete.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        message = self._lookup(self.messages, message_id)
        if message is None or message.get("deleted"):
            return {"success": False, "error": f"Message '{message_id}' not found"}
        channel = self.channels.get(message.get("channel_id") or "")
        allowed = message.get("sender_id") == self.current_user or self._is_admin() or (
            channel is not None and channel.get("owner_id") == self.current_user
        )
        if not allowed:
            return {"success": False, "error": "Only the author, the channel owner or an admin can delete this message"}
        if channel is not None and channel.get("archived"):
            return {"success": False, "error": f"#{channel.get('name')} is archived and read-only"}
        message["deleted"] = True
        if channel is not None and message_id in channel.get("pinned_message_ids", []):
            channel["pinned_message_ids"] = [p for p in channel["pinned_message_ids"] if p != message_id]
        return {"success": True, "message": f"Message '{message_id}' deleted"}

    def pin_message(self, message_id: str) -> dict:
        """Pin a channel message; a channel holds at most 3 pins.

        Args:
            message_id: The channel message to pin.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        message = self._lookup(self.messages, message_id)
        if message is None or message.get("deleted"):
            return {"success": False, "error": f"Message '{message_id}' not found"}
        if message.get("channel_id") is None:
            return {"success": False, "error": "Direct messages cannot be pinned"}
        channel = self._channel_for_posting(message.get("channel_id"))
        if isinstance(channel, str):
            return {"success": False, "error": channel}
        pins = channel.get("pinned_message_ids", [])
        if message_id in pins:
            return {"success": False, "error": f"Message '{message_id}' is already pinned"}
        if len(pins) >= self.max_pins:
            return {"success": False, "error": f"#{channel.get('name')} already has {self.max_pins} pins; unpin one first"}
        channel["pinned_message_ids"] = pins + [message_id]
        return {"success": True, "message": f"Message '{message_id}' pinned in #{channel.get('name')}"}

    def unpin_message(self, message_id: str) -> dict:
        """Remove a message from its channel's pins.

        Args:
            message_id: The pinned message.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        message = self._lookup(self.messages, message_id)
        if message is None:
            return {"success": False, "error": f"Message '{message_id}' not found"}
        channel = self._channel_for_posting(message.get("channel_id"))
        if isinstance(channel, str):
            return {"success": False, "error": channel}
        if message_id not in channel.get("pinned_message_ids", []):
            return {"success": False, "error": f"Message '{message_id}' is not pinned"}
        channel["pinned_message_ids"] = [p for p in channel["pinned_message_ids"] if p != message_id]
        return {"success": True, "message": f"Message '{message_id}' unpinned"}

    def archive_channel(self, channel_id: str) -> dict:
        """Archive a channel, making it read-only; only its owner or an admin may.

        Args:
            channel_id: The channel to archive.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        channel = self._visible_channel(channel_id)
        if channel is None:
            return {"success": False, "error": f"Channel '{channel_id}' not found"}
        if channel.get("archived"):
            return {"success": False, "error": f"#{channel.get('name')} is already archived"}
        if channel.get("owner_id") != self.current_user and not self._is_admin():
            return {"success": False, "error": f"Only the owner of #{channel.get('name')} or an admin can archive it"}
        channel["archived"] = True
        return {"success": True, "message": f"#{channel.get('name')} archived"}

    def block_user(self, user_id: str) -> dict:
        """Block a person: neither side can send the other direct messages any more.

        Args:
            user_id: The person to block.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        user = self._lookup(self.users, user_id)
        if user is None:
            return {"success": False, "error": f"User '{user_id}' not found"}
        if user_id == self.current_user:
            return {"success": False, "error": "You cannot block yourself"}
        me = self._me()
        if me is None:
            return {"success": False, "error": "The signed-in user does not exist"}
        if user_id in me.get("blocked_user_ids", []):
            return {"success": False, "error": f"{user.get('display_name')} is already blocked"}
        me["blocked_user_ids"] = me.get("blocked_user_ids", []) + [user_id]
        return {"success": True, "message": f"{user.get('display_name')} blocked"}
