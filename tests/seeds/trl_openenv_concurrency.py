from openenv.core.env_server import Action, Environment, Observation, State, create_app


class MyAction(Action):
    message: str


class MyObservation(Observation):
    echoed: str = ""


class _MyEnvironment(Environment):
    """The environment file the guide's step 1 edits: it declares concurrent sessions, verbatim."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> MyObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return MyObservation(echoed="ready")

    def step(self, action, timeout_s=None, **kwargs) -> MyObservation:
        self._state.step_count += 1
        return MyObservation(echoed=action.message, reward=0.1 * len(action.message))

    @property
    def state(self) -> State:
        return self._state


def create_my_environment() -> _MyEnvironment:
    return _MyEnvironment()

# -- the guide's block --
app = create_app(
    create_my_environment,
    MyAction,
    MyObservation,
    max_concurrent_envs=64,  # match or exceed generation_batch_size
)
