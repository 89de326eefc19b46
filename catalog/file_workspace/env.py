from typing import Any, Dict, List, Literal, Optional, Tuple, TypedDict, Union


class UserInfo(TypedDict):
    user_id: str
    name: str
    role: Literal["admin", "member"]


class FileNode(TypedDict):
    type: Literal["file"]
    name: str
    owner: str
    read_only: bool
    content: str
    size: int
    modified: str


class DirNode(TypedDict):
    type: Literal["dir"]
    name: str
    owner: str
    read_only: bool
    shared: bool
    modified: str
    children: Dict[str, Union["FileNode", "DirNode"]]


Node = Union[FileNode, DirNode]
MAX_NAME = 64


class FileWorkspace:
    """A multi-user file server: a directory tree with owners, read-only flags, shared folders and a quota."""

    def __init__(self, init_config: Optional[Dict[str, Any]] = None):
        # Users: {user_id: UserInfo}
        self.users: Dict[str, UserInfo] = {}
        # The user on whose behalf every call is made
        self.current_user: str = "admin"
        # The tree: directories hold their entries in "children", keyed by name
        self.root: DirNode = {
            "type": "dir", "name": "", "owner": "admin", "read_only": False,
            "shared": False, "modified": "2024-03-01", "children": {},
        }
        # Most bytes all files together may hold (UTF-8 size of their content)
        self.quota_bytes: int = 100_000
        # Today's date, stamped on what a call creates or changes
        self.current_date: str = "2024-03-01"

    # ------------------------------------------------------------------ helpers

    def _parts(self, path: Any) -> Optional[List[str]]:
        """The names along an absolute path, or None when the path is malformed."""
        if not isinstance(path, str) or not path.startswith("/"):
            return None
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") for p in parts):
            return None
        return parts

    def _resolve(self, parts: List[str]) -> Optional[Node]:
        node: Node = self.root
        for name in parts:
            if node.get("type") != "dir":
                return None
            child = node.get("children", {}).get(name)
            if child is None:
                return None
            node = child
        return node

    def _locate(self, path: Any) -> Tuple[Optional[Node], Optional[str]]:
        parts = self._parts(path)
        if parts is None:
            return None, f"'{path}' is not an absolute path without '.' or '..'"
        node = self._resolve(parts)
        if node is None:
            return None, f"'{path}' does not exist"
        return node, None

    def _parent_for_new(self, path: Any) -> Tuple[Optional[DirNode], str, Optional[str]]:
        """The directory a new entry at ``path`` goes into, its name, or why it cannot be created."""
        parts = self._parts(path)
        if parts is None or not parts:
            return None, "", f"'{path}' is not a valid path for a new entry"
        name = parts[-1]
        if len(name) > MAX_NAME:
            return None, name, f"Names are at most {MAX_NAME} characters"
        parent = self._resolve(parts[:-1])
        if parent is None or parent.get("type") != "dir":
            return None, name, f"Folder '/{'/'.join(parts[:-1])}' does not exist"
        if name in parent.get("children", {}):
            return None, name, f"'{path}' already exists"
        problem = self._insert_problem(parent, self._join(parts[:-1]))
        if problem:
            return None, name, problem
        return parent, name, None

    def _is_admin(self) -> bool:
        return (self.users.get(self.current_user) or {}).get("role") == "admin"

    def _may_change(self, node: Node) -> bool:
        return self._is_admin() or node.get("owner") == self.current_user

    def _insert_problem(self, directory: DirNode, where: str) -> Optional[str]:
        if directory.get("read_only"):
            return f"Folder '{where}' is read-only"
        if not (self._may_change(directory) or directory.get("shared")):
            return f"{self.current_user} may not add entries to folder '{where}'"
        return None

    def _change_problem(self, node: Node, path: str) -> Optional[str]:
        if node.get("read_only"):
            return f"'{path}' is read-only"
        if not self._may_change(node):
            return f"'{path}' belongs to {node.get('owner')}; {self.current_user} may not change it"
        return None

    def _edit_problem(self, node: Node, path: str) -> Optional[str]:
        # Files directly inside a shared folder are team documents: anyone may edit their content.
        parent = self._resolve((self._parts(path) or [])[:-1])
        if parent is not None and parent.get("shared") and not node.get("read_only"):
            return None
        return self._change_problem(node, path)

    def _walk(self, node: Node, path: str) -> List[Tuple[str, Node]]:
        found = [(path or "/", node)]
        if node.get("type") == "dir":
            for name, child in node.get("children", {}).items():
                found.extend(self._walk(child, f"{path}/{name}"))
        return found

    def _used_bytes(self) -> int:
        return sum(int(n.get("size", 0)) for _, n in self._walk(self.root, "") if n.get("type") == "file")

    def _size(self, content: str) -> int:
        return len(content.encode("utf-8"))

    def _summary(self, path: str, node: Node) -> dict:
        entry = {k: v for k, v in node.items() if k not in ("children", "content")}
        entry["path"] = path
        if node.get("type") == "dir":
            entry["entries"] = len(node.get("children", {}))
            entry["size"] = sum(int(n.get("size", 0)) for _, n in self._walk(node, path) if n.get("type") == "file")
        return entry

    def _join(self, parts: List[str]) -> str:
        return "/" + "/".join(parts)

    # ------------------------------------------------------------------ queries

    def list_directory(self, path: str) -> dict:
        """List the entries of a folder, folders first, then by name.

        Args:
            path: Absolute path of the folder, e.g. "/home/alice".

        Returns:
            dict: {"success": True, "data": List[dict]} with each entry's path, type, owner,
            read_only flag, size and modified date, or {"success": False, "error": str}.
        """
        node, problem = self._locate(path)
        if node is None:
            return {"success": False, "error": problem}
        if node.get("type") != "dir":
            return {"success": False, "error": f"'{path}' is a file, not a folder"}
        base = path.rstrip("/")
        entries = [self._summary(f"{base}/{name}", child) for name, child in node.get("children", {}).items()]
        entries.sort(key=lambda e: (e.get("type") != "dir", str(e.get("name"))))
        return {"success": True, "data": entries}

    def get_info(self, path: str) -> dict:
        """Get a file's or folder's metadata (for folders: entry count and total size of files below).

        Args:
            path: Absolute path, e.g. "/shared/team/budget.csv".

        Returns:
            dict: {"success": True, "data": dict} or {"success": False, "error": str}.
        """
        node, problem = self._locate(path)
        if node is None:
            return {"success": False, "error": problem}
        return {"success": True, "data": self._summary(path, node)}

    def read_file(self, path: str) -> dict:
        """Read a file's text content.

        Args:
            path: Absolute path of the file.

        Returns:
            dict: {"success": True, "data": {"path", "content", "size"}} or {"success": False, "error": str}.
        """
        node, problem = self._locate(path)
        if node is None:
            return {"success": False, "error": problem}
        if node.get("type") != "file":
            return {"success": False, "error": f"'{path}' is a folder"}
        return {"success": True, "data": {"path": path, "content": node.get("content", ""), "size": node.get("size", 0)}}

    def find_files(self, name_contains: str, under: str = "/") -> dict:
        """Find files and folders whose name contains the text (case-insensitive).

        Args:
            name_contains: Part of the name to look for, e.g. "invoice".
            under: Absolute path of the folder to search below; the whole tree by default.

        Returns:
            dict: {"success": True, "data": List[dict]} of matching entries with their paths, or
            {"success": False, "error": str}.
        """
        if not isinstance(name_contains, str) or not name_contains.strip():
            return {"success": False, "error": "name_contains must be a non-empty string"}
        node, problem = self._locate(under)
        if node is None:
            return {"success": False, "error": problem}
        needle = name_contains.strip().lower()
        base = under.rstrip("/")
        matches = [
            self._summary(p, n) for p, n in self._walk(node, base)
            if n is not node and needle in str(n.get("name", "")).lower()
        ]
        return {"success": True, "data": matches}

    def get_disk_usage(self) -> dict:
        """Report how many bytes the files use against the quota.

        Returns:
            dict: {"success": True, "data": {"used_bytes", "quota_bytes", "free_bytes"}}.
        """
        used = self._used_bytes()
        return {"success": True, "data": {"used_bytes": used, "quota_bytes": self.quota_bytes,
                                          "free_bytes": max(self.quota_bytes - used, 0)}}

    # ------------------------------------------------------------ state changes

    def make_directory(self, path: str, parents: bool = False) -> dict:
        """Create a folder owned by the current user.

        Args:
            path: Absolute path of the new folder, e.g. "/home/alice/Projects".
            parents: If True, also create missing folders along the path (existing ones are kept).

        Returns:
            dict: {"success": True, "data": {"path", "created": List[str]}} or {"success": False, "error": str}.
        """
        parts = self._parts(path)
        if parts is None or not parts:
            return {"success": False, "error": f"'{path}' is not a valid path for a new folder"}
        if any(len(p) > MAX_NAME for p in parts):
            return {"success": False, "error": f"Names are at most {MAX_NAME} characters"}
        existing = self._resolve(parts)
        if existing is not None:
            return {"success": False, "error": f"'{path}' already exists"}
        to_create: List[str] = []
        node: Node = self.root
        for depth, name in enumerate(parts):
            child = node.get("children", {}).get(name)
            if child is None:
                to_create = parts[depth:]
                break
            if child.get("type") != "dir":
                return {"success": False, "error": f"'{self._join(parts[:depth + 1])}' is a file"}
            node = child
        if len(to_create) > 1 and not parents:
            return {"success": False, "error": f"Folder '{self._join(parts[:-1])}' does not exist (use parents=True)"}
        problem = self._insert_problem(node, self._join(parts[:len(parts) - len(to_create)]))
        if problem:
            return {"success": False, "error": problem}
        created = []
        prefix = parts[:len(parts) - len(to_create)]
        for name in to_create:
            new_dir: DirNode = {"type": "dir", "name": name, "owner": self.current_user, "read_only": False,
                                "shared": False, "modified": self.current_date, "children": {}}
            node["children"][name] = new_dir
            node["modified"] = self.current_date
            node = new_dir
            prefix = prefix + [name]
            created.append(self._join(prefix))
        return {"success": True, "data": {"path": self._join(parts), "created": created}}

    def write_file(self, path: str, content: str, overwrite: bool = False) -> dict:
        """Create a file, or replace an existing file's content when overwrite is True.

        Args:
            path: Absolute path of the file.
            content: The complete text to store.
            overwrite: Replace the file if it already exists (it must then be editable by the current user).

        Returns:
            dict: {"success": True, "data": {"path", "size"}} or {"success": False, "error": str}.
        """
        if not isinstance(content, str):
            return {"success": False, "error": "Content must be a string"}
        parts = self._parts(path)
        existing = self._resolve(parts) if parts else None
        size = self._size(content)
        if existing is not None:
            if existing.get("type") != "file":
                return {"success": False, "error": f"'{path}' is a folder"}
            if not overwrite:
                return {"success": False, "error": f"'{path}' already exists; pass overwrite=True to replace it"}
            problem = self._edit_problem(existing, path)
            if problem:
                return {"success": False, "error": problem}
            if self._used_bytes() - int(existing.get("size", 0)) + size > self.quota_bytes:
                return {"success": False, "error": "Not enough space left in the quota"}
            existing["content"] = content
            existing["size"] = size
            existing["modified"] = self.current_date
            return {"success": True, "data": {"path": path, "size": size}}
        parent, name, problem = self._parent_for_new(path)
        if parent is None:
            return {"success": False, "error": problem}
        if self._used_bytes() + size > self.quota_bytes:
            return {"success": False, "error": f"Not enough space left in the quota for {size} bytes"}
        parent["children"][name] = {"type": "file", "name": name, "owner": self.current_user, "read_only": False,
                                    "content": content, "size": size, "modified": self.current_date}
        parent["modified"] = self.current_date
        return {"success": True, "data": {"path": path, "size": size}}

    def append_to_file(self, path: str, content: str) -> dict:
        """Add text to the end of an existing file the current user may edit.

        Args:
            path: Absolute path of the file.
            content: The text to add, exactly as given (include a leading newline to start a new line).

        Returns:
            dict: {"success": True, "data": {"path", "size"}} or {"success": False, "error": str}.
        """
        node, problem = self._locate(path)
        if node is None:
            return {"success": False, "error": problem}
        if node.get("type") != "file":
            return {"success": False, "error": f"'{path}' is a folder"}
        if not isinstance(content, str) or not content:
            return {"success": False, "error": "Content must be a non-empty string"}
        problem = self._edit_problem(node, path)
        if problem:
            return {"success": False, "error": problem}
        added = self._size(content)
        if self._used_bytes() + added > self.quota_bytes:
            return {"success": False, "error": "Not enough space left in the quota"}
        node["content"] = str(node.get("content", "")) + content
        node["size"] = int(node.get("size", 0)) + added
        node["modified"] = self.current_date
        return {"success": True, "data": {"path": path, "size": node["size"]}}

    def move_path(self, source: str, destination: str) -> dict:
        """Move or rename a file or folder; the destination is the entry's full new path.

        The entry must be changeable by the current user and the folder it leaves must not
        be read-only. A folder cannot be moved inside itself.

        Args:
            source: Absolute path of the entry to move.
            destination: Absolute new path, e.g. "/home/alice/Documents/notes.txt" (must not exist yet).

        Returns:
            dict: {"success": True, "data": {"source", "destination"}} or {"success": False, "error": str}.
        """
        src_parts = self._parts(source)
        dst_parts = self._parts(destination)
        if not src_parts or dst_parts is None:
            return {"success": False, "error": "Both paths must be absolute, and the root cannot be moved"}
        node = self._resolve(src_parts)
        if node is None:
            return {"success": False, "error": f"'{source}' does not exist"}
        if dst_parts[:len(src_parts)] == src_parts:
            return {"success": False, "error": "A folder cannot be moved inside itself"}
        problem = self._change_problem(node, source)
        if problem:
            return {"success": False, "error": problem}
        old_parent: DirNode = self._resolve(src_parts[:-1])
        if old_parent.get("read_only"):
            return {"success": False, "error": f"Folder '{self._join(src_parts[:-1])}' is read-only"}
        new_parent, name, problem = self._parent_for_new(destination)
        if new_parent is None:
            return {"success": False, "error": problem}
        del old_parent["children"][src_parts[-1]]
        node["name"] = name
        node["modified"] = self.current_date
        new_parent["children"][name] = node
        old_parent["modified"] = self.current_date
        new_parent["modified"] = self.current_date
        return {"success": True, "data": {"source": source, "destination": self._join(dst_parts)}}

    def copy_file(self, source: str, destination: str) -> dict:
        """Copy a file to a new path; the copy belongs to the current user and is not read-only.

        Args:
            source: Absolute path of the file to copy (any readable file).
            destination: Absolute path of the copy (must not exist yet).

        Returns:
            dict: {"success": True, "data": {"path", "size"}} or {"success": False, "error": str}.
        """
        node, problem = self._locate(source)
        if node is None:
            return {"success": False, "error": problem}
        if node.get("type") != "file":
            return {"success": False, "error": f"'{source}' is a folder; only files can be copied"}
        parent, name, problem = self._parent_for_new(destination)
        if parent is None:
            return {"success": False, "error": problem}
        size = int(node.get("size", 0))
        if self._used_bytes() + size > self.quota_bytes:
            return {"success": False, "error": f"Not enough space left in the quota for {size} bytes"}
        parent["children"][name] = {"type": "file", "name": name, "owner": self.current_user, "read_only": False,
                                    "content": node.get("content", ""), "size": size, "modified": self.current_date}
        parent["modified"] = self.current_date
        return {"success": True, "data": {"path": destination, "size": size}}

    def delete_path(self, path: str, recursive: bool = False) -> dict:
        """Delete a file, or a folder (a non-empty folder only with recursive=True).

        Everything deleted must be changeable by the current user and not read-only,
        and the folder holding the entry must not be read-only.

        Args:
            path: Absolute path of the entry to delete (not the root).
            recursive: Allow deleting a folder together with everything inside it.

        Returns:
            dict: {"success": True, "data": {"deleted": List[str], "freed_bytes": int}} or
            {"success": False, "error": str}.
        """
        parts = self._parts(path)
        if not parts:
            return {"success": False, "error": f"'{path}' is not a path that can be deleted"}
        node = self._resolve(parts)
        if node is None:
            return {"success": False, "error": f"'{path}' does not exist"}
        parent: DirNode = self._resolve(parts[:-1])
        if parent.get("read_only"):
            return {"success": False, "error": f"Folder '{self._join(parts[:-1])}' is read-only"}
        if node.get("type") == "dir" and node.get("children") and not recursive:
            return {"success": False, "error": f"Folder '{path}' is not empty (use recursive=True)"}
        doomed = self._walk(node, self._join(parts))
        for entry_path, entry in doomed:
            problem = self._change_problem(entry, entry_path)
            if problem:
                return {"success": False, "error": problem}
        del parent["children"][parts[-1]]
        parent["modified"] = self.current_date
        freed = sum(int(n.get("size", 0)) for _, n in doomed if n.get("type") == "file")
        return {"success": True, "data": {"deleted": [p for p, _ in doomed], "freed_bytes": freed}}

    def set_read_only(self, path: str, read_only: bool) -> dict:
        """Protect an entry from changes, or lift that protection; only its owner or an admin may.

        Args:
            path: Absolute path of the file or folder.
            read_only: True to protect it, False to make it changeable again.

        Returns:
            dict: {"success": True, "message": str} or {"success": False, "error": str}.
        """
        node, problem = self._locate(path)
        if node is None:
            return {"success": False, "error": problem}
        if not self._parts(path):
            return {"success": False, "error": "The root cannot be made read-only"}
        if not isinstance(read_only, bool):
            return {"success": False, "error": "read_only must be true or false"}
        if not self._may_change(node):
            return {"success": False, "error": f"'{path}' belongs to {node.get('owner')}; {self.current_user} may not change it"}
        node["read_only"] = read_only
        return {"success": True, "message": f"'{path}' is now {'read-only' if read_only else 'changeable'}"}
